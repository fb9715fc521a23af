"""The ROCm library list against real sources: the library names of ROCm's own manifests (kept in
tests/data/rocm-library-sources.toml, each with repository, path and commit), and the DT_NEEDED
names of real ROCm wheels from PyPI, downloaded once into a cache outside the repository."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

from pipeline.repair.policy import load_policy
from pipeline.wheel.analyze import system_libraries
from pipeline.wheel.archive import open_wheel
from pipeline.wheel.elf import ELF_MAGIC, read_elf
from tests.helpers import REPO, ROCWHEELS

SOURCES = Path(__file__).parent / "data" / "rocm-library-sources.toml"

# Real ROCm wheels that link many ROCm libraries (about 220 MB together). jax-rocm7-pjrt 0.10.0's
# XLA plugin links rocprofiler-sdk's rocpd and attach libraries, which the list once lacked.
PYPI_ROCM_WHEELS = ("jax-rocm7-pjrt==0.10.0", "jax-rocm7-plugin==0.10.0", "cupy-rocm-7-0==14.2.0")
PJRT = "jax-rocm7-pjrt==0.10.0"
# Wheels for Python 3.11 whatever runs the tests (jax-rocm7-plugin has one per Python).
PIP_DOWNLOAD = (
    sys.executable,
    "-m",
    "pip",
    "download",
    "--no-deps",
    "--only-binary=:all:",
    "--python-version",
    "3.11",
    "--disable-pip-version-check",
    "-q",
)

# Sonames these wheels need that are neither ROCm's nor allowed by a manylinux policy: repair grafts
# the system's copy (rocm-libraries.toml leaves libnuma out on purpose).
GRAFTED_SYSTEM_LIBRARIES = frozenset({"libnuma.so.1"})


def test_every_manifest_library_is_rocm() -> None:
    policy = load_policy()
    sources = tomllib.loads(SOURCES.read_text(encoding="utf-8"))["sources"]
    missing = [
        f"{name} ({source['repo']} {source['path']} at {source['commit']})"
        for source in sources
        for name in source["names"]
        if not policy.is_rocm(_example_soname(name))
    ]
    assert not missing, "pipeline/data/rocm-libraries.toml lacks:\n" + "\n".join(missing)


def test_example_sonames_of_manifest_patterns() -> None:
    assert _example_soname("libamdhip64.so*") == "libamdhip64.so.1"
    assert _example_soname("librocm_sysdeps_liblzma.so.*") == "librocm_sysdeps_liblzma.so.1"
    assert _example_soname("librocdxg*.so*") == "librocdxg.so.1"


def test_grafted_system_libraries_are_not_rocm() -> None:
    assert not any(load_policy().is_rocm(name) for name in GRAFTED_SYSTEM_LIBRARIES)


@pytest.fixture(scope="session")
def pypi_rocm_wheels() -> dict[str, Path]:
    """Requirement -> the wheel, downloaded once into ``ROCWHEELS_TEST_CACHE``
    (default ~/.cache/rocwheels/test-wheels); a file lock keeps parallel sessions from racing."""
    folder = Path(os.environ.get("ROCWHEELS_TEST_CACHE", Path.home() / ".cache" / "rocwheels" / "test-wheels"))
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(folder / ".download.lock"):
        return {requirement: _cached_wheel(requirement, folder) for requirement in PYPI_ROCM_WHEELS}


@pytest.mark.network
def test_pypi_rocm_wheels_need_only_bundled_system_or_rocm_libraries(pypi_rocm_wheels: dict[str, Path]) -> None:
    policy = load_policy()
    allowed = system_libraries() | GRAFTED_SYSTEM_LIBRARIES
    unknown = []
    for wheel in pypi_rocm_wheels.values():
        with open_wheel(wheel) as archive:
            bundled = {name.rsplit("/", 1)[-1] for name in archive.namelist()}
        for member, needed in _needed_by_member(wheel):
            unknown += [
                f"{wheel.name}: {member} needs {soname}"
                for soname in needed
                if soname not in bundled
                and soname not in allowed
                # the dynamic loader: auditwheel takes it as the interpreter, not from a policy
                and not soname.startswith("ld-linux")
                and not policy.is_rocm(soname)
            ]
    assert not unknown, (
        "sonames neither bundled, allowed by a manylinux policy, nor in pipeline/data/rocm-libraries.toml "
        "(add ROCm's there, citing where the name comes from):\n" + "\n".join(unknown)
    )


@pytest.mark.network
def test_jax_rocm7_pjrt_repairs_without_grafting_rocm(pypi_rocm_wheels: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = subprocess.run(
        [*ROCWHEELS, "repair", pypi_rocm_wheels[PJRT], "-w", out],
        cwd=REPO,
        env={**os.environ, "ROCWHEELS_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (repaired,) = out.glob("jax_rocm7_pjrt-0.10.0-*.whl")
    with open_wheel(repaired) as archive:
        grafted = [name for name in archive.namelist() if ".libs/" in name]
    assert grafted, "expected the system's libnuma grafted (Debian's libnuma1, which hipcc brings)"
    assert not [name for name in grafted if load_policy().is_rocm(name)], grafted
    needs = dict(_needed_by_member(repaired))
    plugin = needs["jax_plugins/xla_rocm7/xla_rocm_plugin.so"]
    assert {"librocprofiler-sdk-rocpd.so.1", "librocprofiler-sdk-attach.so.1"} <= set(plugin)


def _example_soname(pattern: str) -> str:
    """A soname the manifest's ``pattern`` names: its so-version as ``.1``, other wildcards empty."""
    return pattern.replace(".so.*", ".so*").replace(".so*", ".so.1").replace("*", "")


def _cached_wheel(requirement: str, folder: Path) -> Path:
    name, version = requirement.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    if not list(folder.glob(pattern)):
        # Into a folder of its own first: an interrupted download must not pass for the wheel.
        with tempfile.TemporaryDirectory(dir=folder) as partial:
            subprocess.run([*PIP_DOWNLOAD, "-d", partial, requirement], check=True)
            for wheel in Path(partial).glob(pattern):
                wheel.rename(folder / wheel.name)
    (wheel,) = folder.glob(pattern)
    return wheel


def _needed_by_member(wheel: Path) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(member, DT_NEEDED) of each ELF file of ``wheel``, extracted one at a time (some are GBs)."""
    with open_wheel(wheel) as archive, tempfile.TemporaryDirectory(prefix="rocwheels-needed-") as scratch:
        for member in archive.namelist():
            with archive.open(member) as stream:
                if stream.read(len(ELF_MAGIC)) != ELF_MAGIC:
                    continue
            path = Path(archive.extract(member, scratch))
            yield member, read_elf(path, with_fatbin=False).needed
            path.unlink()
