"""The canary as the benchmarks build it: shared by rebuild.py (its rebuilds) and run.py (the wheel
its smoke-test figure verifies)."""

from __future__ import annotations

from pathlib import Path

CANARY = "rocm-canary"


def canary_wheels(arch: str, wheelhouse: Path, work_dir: Path) -> list[str]:
    """rocwheels' arguments that build the canary alone for ``arch`` on this host (the local driver)."""
    return [
        *("--wheelhouse", str(wheelhouse), "--work-dir", str(work_dir)),
        *("wheels", "--arch", arch, "--driver", "local", "--recipes", CANARY),
    ]
