"""Smoke test: install a wheel into a fresh venv and run its recipe's import check.

GPU checks (``gpu_code``) run only where the kernel exposes an AMD GPU (``/dev/kfd``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.recipes import Smoke
from pipeline.config.toolchain import python_version
from pipeline.errors import CommandError
from pipeline.util.cmd import run
from pipeline.wheel.archive import parse_wheel_name, split_variant

KFD = Path("/dev/kfd")


@dataclass(frozen=True)
class SmokeResult:
    passed: bool
    skipped: bool
    message: str


def gpu_present() -> bool:
    return KFD.exists()


def interpreter_for(wheel: Path) -> str | None:
    """A Python on this machine that can install the wheel (its cpXY tag), or None."""
    tags = parse_wheel_name(wheel.name)[3]
    versions = {version for tag in tags if (version := python_version(tag.interpreter))}
    if not versions or f"{sys.version_info.major}.{sys.version_info.minor}" in versions:
        return sys.executable
    for version in sorted(versions):
        found = shutil.which(f"python{version}")
        # A pyenv shim is on PATH for every version it knows, and fails for the inactive ones.
        if found and run([found, "-c", ""], check=False, quiet=True).returncode == 0:
            return found
    return None


def smoke_test(
    wheel: Path,
    smoke: Smoke,
    *,
    requirements: Sequence[str] = (),
    find_links: Path | None = None,
    index_urls: Sequence[str] = (),
    checks: Sequence[str] = (),
    log_file: Path | None = None,
    scratch: Path | None = None,
) -> SmokeResult:
    """Install ``wheel`` (and ``requirements``, found in ``find_links`` or the extra ``index_urls``)
    into a fresh venv, run the recipe's snippets, then ``checks`` (more Python snippets)."""
    python = interpreter_for(wheel)
    if python is None:
        return SmokeResult(False, True, f"no Python on this machine matches {wheel.name}; not installed")
    with tempfile.TemporaryDirectory(prefix="rocwheels-smoke-", dir=scratch) as folder:
        venv = Path(folder) / "venv"
        venv_python = venv / "bin" / "python"
        wheel = _installable(wheel, Path(folder))
        try:
            # No pip inside: seeding one is most of a venv's cost. rocwheels' own pip installs into
            # it (--python), with the same resolver, configuration and constraints as before.
            run([python, "-m", "venv", "--without-pip", venv], log_file=log_file)
            links = ["--find-links", str(find_links)] if find_links else []
            links += [option for url in index_urls for option in ("--extra-index-url", url)]
            # --no-compile: the venv is thrown away, and byte-compiling the torch it installs is slow.
            run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "--python",
                    venv_python,
                    "install",
                    "--disable-pip-version-check",
                    "-q",
                    "--no-compile",
                    *links,
                    wheel,
                    *requirements,
                ],
                log_file=log_file,
                cwd=Path(folder),
            )
            for snippet in (*smoke.snippets(gpu=gpu_present()), *checks):
                run([venv_python, "-c", snippet], log_file=log_file, cwd=Path(folder))
        except CommandError as exc:
            return SmokeResult(False, False, f"smoke test failed: {exc.message}")
    gpu = (
        "GPU check passed"
        if smoke.gpu_code and gpu_present()
        else "no GPU here: GPU check not run"
        if smoke.gpu_code
        else "no GPU check"
    )
    return SmokeResult(True, False, f"installed in a fresh venv; {', '.join(smoke.imports)} imported; {gpu}")


def _installable(wheel: Path, folder: Path) -> Path:
    """``wheel`` under a name pip installs: a variant wheel's bytes under its name without the label
    (no pip reads PEP 825 names yet; its variant.json is one more file of the install)."""
    plain, label = split_variant(wheel.name)
    if label is None:
        return wheel
    target = folder / plain
    try:
        os.link(wheel, target)
    except OSError:  # another file system
        shutil.copyfile(wheel, target)
    return target
