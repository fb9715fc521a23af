"""Whether a wheel's GPU check runs on this host: only on GPUs its code objects run on, which this
user may open. The GPUs are stand-ins (tests/helpers/fake_gpu.py); everything else is real."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pipeline.verify import host_gpus as host_gpus_module
from pipeline.verify.host_gpus import GpuCheck, gpu_check, host_gpus, processor_name
from tests.helpers import REPO
from tests.helpers.fake_gpu import fake_gpus

GFX90A, GFX942, GFX1100 = 90010, 90402, 110000


@pytest.mark.parametrize(
    ("version", "processor"),
    # As Linux's amdkfd sets them (kfd_device.c, kgd2kfd_probe): Vega20, Arcturus, Aldebaran, Navi10,
    # and GC 11.0.1 (Phoenix).
    [(90006, "gfx906"), (90008, "gfx908"), (90010, "gfx90a"), (100100, "gfx1010"), (110003, "gfx1103")],
)
def test_gfx_target_versions_name_their_processors(version: int, processor: str) -> None:
    assert processor_name(version) == processor


def test_the_gpus_are_read_in_node_order_without_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(tmp_path, monkeypatch, *[GFX90A] * 10, GFX1100)
    (tmp_path / "topology" / "nodes" / "notes").mkdir()
    assert host_gpus() == ("gfx90a",) * 10 + ("gfx1100",)  # node 11 after node 2


def test_a_host_without_the_kfd_topology_has_no_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_gpus_module, "KFD_NODES", tmp_path / "no-kfd" / "topology" / "nodes")
    assert host_gpus() == ()


def test_without_a_gpu_the_check_does_not_run() -> None:
    if Path("/dev/kfd").exists():
        pytest.skip("this host has an AMD GPU")
    assert gpu_check([("gfx942",)]) == GpuCheck(False, "no GPU here")


@pytest.mark.parametrize(
    ("gpus", "code_targets", "expected"),
    [
        ((GFX90A,), [("gfx942",)], GpuCheck(False, "the wheel has no code for gfx90a here (built for gfx942)")),
        ((GFX90A,), [("gfx90a:xnack-", "gfx942")], GpuCheck(True, "on gfx90a")),
        ((GFX942,), [("gfx9-4-generic",)], GpuCheck(True, "on gfx942")),
        # Every file with code must have it for the GPU: the other one's kernels would not load.
        (
            (GFX90A,),
            [("gfx90a", "gfx942"), ("gfx942",)],
            GpuCheck(False, "the wheel has no code for gfx90a here (built for gfx90a, gfx942)"),
        ),
        # The runtime may pick any of them.
        (
            (GFX90A, GFX1100),
            [("gfx90a",)],
            GpuCheck(False, "the wheel has no code for gfx1100 here (built for gfx90a)"),
        ),
        # Code compiled as it runs (Triton): any GPU.
        ((GFX1100,), None, GpuCheck(True, "on gfx1100")),
    ],
    ids=["other-gpu", "target-id", "generic", "one-file-lacks-it", "mixed-host", "jit"],
)
def test_the_check_runs_only_where_the_code_runs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    gpus: tuple[int, ...],
    code_targets: list[tuple[str, ...]] | None,
    expected: GpuCheck,
) -> None:
    fake_gpus(tmp_path, monkeypatch, *gpus)
    assert gpu_check(code_targets) == expected


def test_a_kfd_without_gpu_nodes_does_not_run_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(tmp_path, monkeypatch)  # the CPU node only
    check = gpu_check(None)
    assert not check.run and "lists no GPU" in check.why


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to run as another user")
def test_a_kfd_this_user_cannot_open_does_not_run_the_check() -> None:
    """As `nobody`, outside the device's group (the usual missing render/video group): told, not failed."""
    root = Path(tempfile.mkdtemp(prefix="rocwheels-kfd-"))  # not under pytest's folders: those are root's alone
    try:
        root.chmod(0o755)
        with pytest.MonkeyPatch.context() as patch:
            kfd = fake_gpus(root, patch, GFX90A)
        kfd.chmod(0o600)
        code = (
            "import pathlib; import pipeline.verify.host_gpus as h; "
            f"h.KFD, h.KFD_NODES = pathlib.Path({str(kfd)!r}), pathlib.Path({str(root / 'topology' / 'nodes')!r}); "
            "print(h.gpu_check(None))"
        )
        as_root = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
        assert "run=True" in as_root.stdout, as_root.stdout
        nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        as_nobody = subprocess.run([*nobody, sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
        assert as_nobody.returncode == 0, as_nobody.stderr
        assert "run=False" in as_nobody.stdout and "is not readable and writable by this user" in as_nobody.stdout
    finally:
        shutil.rmtree(root)
