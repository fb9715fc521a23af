"""A stand-in for an AMD GPU, the one thing this machine cannot have: a ``/dev/kfd`` file and a KFD
topology in sysfs's layout (a CPU node, then a node per GPU with its ``gfx_target_version``), put
where :mod:`pipeline.verify.host_gpus` looks."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.verify import host_gpus


def fake_gpus(root: Path, monkeypatch: pytest.MonkeyPatch, *gfx_target_versions: int) -> Path:
    """GPUs with these ``gfx_target_version`` values (90010: gfx90a) under ``root``; the fake /dev/kfd."""
    nodes = root / "topology" / "nodes"
    for number, version in enumerate((0, *gfx_target_versions)):  # node 0: the CPU
        (nodes / str(number)).mkdir(parents=True)
        cores = 0 if version else 16
        (nodes / str(number) / "properties").write_text(
            f"cpu_cores_count {cores}\nsimd_count {0 if cores else 104}\ngfx_target_version {version}\n"
        )
    kfd = root / "kfd"
    kfd.write_bytes(b"")
    monkeypatch.setattr(host_gpus, "KFD", kfd)
    monkeypatch.setattr(host_gpus, "KFD_NODES", nodes)
    return kfd
