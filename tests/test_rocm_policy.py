"""The ROCm library policy: which sonames are ROCm's (excluded from grafting) and which are not."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import RocwheelsError
from pipeline.repair.policy import load_policy, rocm_patterns
from pipeline.wheel.elf import read_elf


@pytest.mark.parametrize(
    "soname",
    [
        "libamdhip64.so.7",
        "libamdhip64.so.6",
        "libamdhip64.so.6.4.43484",
        "libamdhip64.so.5",
        "librocblas.so.4",
        "libMIOpen.so.1",
        "libamdhip64.so",
        "libhsa-runtime64.so.1",
        "libhipblaslt.so.0",
        "librccl.so.1",
        "libroctx64.so.4",
        "librocm_sysdeps_numa.so.1",
        "libmigraphx_gpu.so.2",
        "librocprofiler-register.so.0",
    ],
)
def test_rocm_libraries_match_in_every_so_version(soname: str) -> None:
    assert load_policy().is_rocm(soname)


@pytest.mark.parametrize(
    "soname",
    [
        "libgomp.so.1",
        "libz.so.1",
        "libstdc++.so.6",
        "libc.so.6",
        "libnuma.so.1",
        "libdrm.so.2",
        "libelf.so.1",
        "libLLVM-15.so.1",
        "libpython3.11.so.1.0",
        "libtorch.so",
        "libc10.so",
    ],
)
def test_foreign_libraries_are_not_rocm(soname: str) -> None:
    assert not load_policy().is_rocm(soname)


def test_grafted_names_and_paths_are_seen_through() -> None:
    policy = load_policy()
    # auditwheel renames grafted copies: libamdhip64.so.5 -> libamdhip64-1a2b3c4d.so.5
    assert policy.is_rocm("pkg.libs/libamdhip64-1a2b3c4d.so.5")
    assert policy.is_rocm("/opt/rocm/lib/librocblas.so.4")
    assert not policy.is_rocm("pkg.libs/libgomp-a34b3233.so.1")


def test_every_pattern_covers_so_versions() -> None:
    # fnmatch: "libamdhip64.so" would not match "libamdhip64.so.7" (the auditwheel --exclude trap).
    patterns = rocm_patterns()
    assert patterns and len(set(patterns)) == len(patterns)
    assert all(pattern.endswith(".so*") for pattern in patterns), patterns


@pytest.mark.hipcc
def test_the_local_hip_runtime_is_rocm(hip_library: Path) -> None:
    runtime = [soname for soname in read_elf(hip_library).needed if soname.startswith("libamdhip64")]
    assert runtime, "a hipcc-built library should need the HIP runtime"
    assert load_policy().is_rocm(runtime[0])


def test_extra_excludes_extend_the_excludes_not_rocm() -> None:
    policy = load_policy(["libtorch*.so", "libc10*.so", "libtorch*.so"])
    assert policy.extra_excludes == ("libtorch*.so", "libc10*.so")
    assert policy.excludes[: len(policy.patterns)] == policy.patterns
    assert policy.is_excluded("libtorch_hip.so") and policy.is_excluded("libamdhip64.so.7")
    assert not policy.is_rocm("libtorch_hip.so")
    assert not policy.is_excluded("libgomp.so.1")


@pytest.mark.parametrize("pattern", ["", " ", "libtorch*.so "])
def test_blank_exclude_patterns_are_rejected(pattern: str) -> None:
    with pytest.raises(RocwheelsError, match="exclude"):
        load_policy([pattern])
