"""``rocwheels doctor`` on this host (no AMD GPU), plus the GPU checks against fake device folders
and a fake rocminfo. No test here starts a container."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.build.engine import Engine
from pipeline.config.lock import load_lock
from pipeline.doctor import (
    Check,
    device_check,
    format_check,
    gpu_targets_check,
    image_test,
    render_nodes_check,
    run_doctor,
)
from tests.helpers import REPO

# One rocminfo agent section per device, trimmed to the lines the doctor reads.
ROCMINFO = """\
*******
Agent 1
*******
  Name:                    AMD EPYC 7763 64-Core Processor
  Marketing Name:          AMD EPYC 7763 64-Core Processor
*******
Agent 2
*******
  Name:                    gfx90a
  Marketing Name:          AMD Instinct MI210
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-
*******
Agent 3
*******
  Name:                    gfx90a
  Marketing Name:          AMD Instinct MI210
"""


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


@pytest.fixture
def no_gpu_here() -> None:
    if Path("/dev/kfd").exists():
        # A GPU host (a team's self-hosted ROCm runner) is no failure: device_check's own test covers it.
        pytest.skip("describes a host without an AMD GPU; /dev/kfd exists here")


@pytest.fixture
def fake_rocminfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``fake_rocminfo(output, exit_code)`` puts a rocminfo printing ``output`` first on PATH."""

    def install(output: str, exit_code: int = 0) -> None:
        (tmp_path / "rocminfo.out").write_text(output)
        tool = tmp_path / "rocminfo"
        tool.write_text(f"#!/bin/sh\ncat {tmp_path / 'rocminfo.out'}\nexit {exit_code}\n")
        tool.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")

    return install


@pytest.mark.container  # a working podman is what it reports
def test_doctor_on_this_host(no_gpu_here: None) -> None:
    line = load_lock(REPO / "recipes").line("debian13")
    checks = by_name(run_doctor("gfx942", line, line_name="debian13"))
    assert list(checks) == [
        "container engine",
        "/dev/kfd",
        "/dev/dri",
        "groups",
        "GPU targets",
        "host ROCm",
        "installed torch",
    ]

    assert checks["container engine"].ok is True, checks["container engine"]
    assert "podman" in checks["container engine"].detail

    kfd = checks["/dev/kfd"]
    assert kfd.ok is False and kfd.detail == "no AMD GPU on this host (/dev/kfd missing)"
    assert "building needs no GPU" in (kfd.fix or "") and "amdgpu" in (kfd.fix or "")

    # rocminfo missing, or failing for want of the kernel driver, is no verdict on the host.
    gpus = checks["GPU targets"]
    assert gpus.ok is None and gpus.fix, gpus
    assert gpus.detail.startswith(("rocminfo not installed", "rocminfo failed (exit"))
    assert "\x1b[" not in gpus.detail

    if os.geteuid() == 0:
        assert checks["groups"] == Check("groups", True, "running as root: device access does not depend on groups")


def test_image_test_without_a_gpu_starts_no_container(no_gpu_here: None, tmp_path: Path) -> None:
    called = tmp_path / "called"
    engine_script = tmp_path / "podman"
    engine_script.write_text(f"#!/bin/sh\ntouch {called}\n")
    engine_script.chmod(0o755)
    check = image_test(Engine("podman", (str(engine_script),)), "localhost/rocwheels-builder:any")
    assert not called.exists(), "the engine was called"
    assert check.ok is None
    assert check.detail.startswith("no AMD GPU on this host (/dev/kfd missing)")
    assert check.fix


def test_device_checks_with_present_devices(tmp_path: Path) -> None:
    kfd = tmp_path / "kfd"
    kfd.write_text("")
    dri = tmp_path / "dri"
    dri.mkdir()
    (dri / "card0").write_text("")
    assert render_nodes_check(dri).ok is False, "a card node alone is no render node"
    (dri / "renderD128").write_text("")
    assert device_check(kfd) == Check(str(kfd), True, "present, readable and writable")
    assert render_nodes_check(dri) == Check(str(dri), True, "renderD128 readable and writable")
    if os.geteuid() != 0:  # root may read and write anything
        kfd.chmod(0o400)
        assert device_check(kfd).ok is False and "usermod -aG render,video" in (device_check(kfd).fix or "")


@pytest.mark.parametrize(
    ("arch", "ok", "detail"),
    [
        ((), True, "this host has gfx90a"),
        (("gfx90a", "gfx942"), True, "this host has gfx90a"),
        (("gfx942",), False, "this host has gfx90a; ARCH=gfx942 has no code for gfx90a"),
    ],
)
def test_gpu_targets_from_rocminfo(fake_rocminfo, arch: tuple[str, ...], ok: bool, detail: str) -> None:
    fake_rocminfo(ROCMINFO)
    check = gpu_targets_check(arch)
    assert (check.ok, check.detail) == (ok, detail)


def test_a_generic_target_has_code_for_the_gpus_it_serves(fake_rocminfo) -> None:
    fake_rocminfo(ROCMINFO.replace("gfx90a", "gfx942"))
    assert gpu_targets_check(("gfx9-4-generic",)) == Check("GPU targets", True, "this host has gfx942")
    assert gpu_targets_check(("gfx9-generic",)).ok is False


def test_failing_rocminfo_is_not_applicable_and_quotes_its_verdict(fake_rocminfo) -> None:
    fake_rocminfo(
        "libkmod: ERROR could not open /proc/modules\n\x1b[31mROCk module is NOT loaded, possibly no GPU devices\x1b[0m\n",
        1,
    )
    check = gpu_targets_check(("gfx942",))
    assert check.ok is None
    assert check.detail == "rocminfo failed (exit 1): ROCk module is NOT loaded, possibly no GPU devices"


def test_format_check() -> None:
    assert format_check(Check("groups", True, "root", "never shown")) == "✓ groups: root"
    assert format_check(Check("/dev/kfd", False, "missing", "install it")) == "✗ /dev/kfd: missing\n    fix: install it"
    assert format_check(Check("GPU targets", None, "rocminfo not installed", "install rocminfo")) == (
        "– GPU targets: rocminfo not installed\n    fix: install rocminfo"
    )
