"""Repair end to end: real HIP extensions built here, real auditwheel, real patchelf.

The HIP wheel holds two extension modules:
- ``hipext/_kernel``: HIP code that also links ``libtestdep.so.1``, a library of the test's own
  found through LD_LIBRARY_PATH: it must be grafted into ``hipext.libs/``, the HIP runtime not;
- ``hipext/sub/_linked``: HIP code that links ``libfakelink.so`` from another package
  (``fakepkg/lib``, declared in link_packages) and carries a build-machine RUNPATH with an empty
  entry, which auditwheel leaves alone (nothing of it is grafted) and repair must clean.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.cmd import run
from pipeline.elf import read_elf
from pipeline.errors import RocwheelsError
from pipeline.repair import LinkPackage, _one_platform_tag, _retag, repair_wheel
from pipeline.rocm_policy import load_policy
from pipeline.wheelfile import check_wheel

HIP_ENV = {"HIP_PLATFORM": "amd"}
EXT = sysconfig.get_config_var("EXT_SUFFIX")
PY_INCLUDE = sysconfig.get_paths()["include"]
ROCM_LIB_DIR = "/opt/rocm/lib"
LINK = "fakepkg/lib:libfakelink.so*"

# One source for every test module; -D picks its name and the library function it calls.
MODULE_SOURCE = r"""
#include <Python.h>
#ifdef __HIP__
#include <hip/hip_runtime.h>
__global__ void add_one(int* x) { x[threadIdx.x] += 1; }
#endif
#define CAT(a, b) a##b
#define INIT(name) CAT(PyInit_, name)
#define STR(x) #x
#define NAME(x) STR(x)
#ifdef __cplusplus
extern "C"
#endif
int VALUE_FN(void);

static PyObject* value(PyObject* self, PyObject* args) { return PyLong_FromLong(VALUE_FN()); }
#ifdef __HIP__
static PyObject* launch(PyObject* self, PyObject* args) {
    hipLaunchKernelGGL(add_one, dim3(1), dim3(1), 0, 0, (int*)0);
    return PyLong_FromLong(hipGetLastError());
}
#endif
static PyMethodDef methods[] = {
    {"value", value, METH_NOARGS, 0},
#ifdef __HIP__
    {"launch", launch, METH_NOARGS, 0},
#endif
    {0, 0, 0, 0},
};
static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, NAME(MODULE), 0, -1, methods};
PyMODINIT_FUNC INIT(MODULE)(void) { return PyModule_Create(&module_def); }
"""


@dataclass(frozen=True)
class Built:
    deps: Path  # on LD_LIBRARY_PATH: libtestdep.so.1, libfakelink.so, libtestmid.so.1
    fakelink: Path
    missing: Path  # C extension needing libgone.so.1, which is nowhere
    indirect: Path  # C extension needing libtestmid.so.1, which needs libgone.so.1
    recent: Path  # C extension calling dlopen@GLIBC_2.34: too recent for manylinux_2_17


@dataclass(frozen=True)
class HipExtensions:
    kernel: Path  # needs the HIP runtime and libtestdep.so.1
    linked: Path  # needs the HIP runtime and libfakelink.so; RUNPATH "<build>/lib:"


def _shared_library(folder: Path, soname: str, source: str, *link: str) -> Path:
    """gcc-built ``folder/soname`` plus the unversioned link name the linker looks for."""
    c_file = folder / f"{soname}.c"
    c_file.write_text(source)
    library = folder / soname
    run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", c_file, "-o", library, *link])
    plain = folder / (soname.split(".so")[0] + ".so")
    if plain != library:
        plain.symlink_to(soname)
    return library


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The test's own libraries and the gcc-built extensions (no hipcc needed)."""
    root = tmp_path_factory.mktemp("repair-build")
    deps, gone, ext = root / "deps", root / "gone", root / "ext"
    for folder in (deps, gone, ext):
        folder.mkdir()
    _shared_library(deps, "libtestdep.so.1", "int testdep_value(void) { return 41; }\n")
    fakelink = _shared_library(deps, "libfakelink.so", "int fakelink_value(void) { return 7; }\n")
    _shared_library(gone, "libgone.so.1", "int gone_value(void) { return 1; }\n")
    _shared_library(deps, "libtestmid.so.1", "int gone_value(void);\nint mid_value(void) { return gone_value(); }\n",
                    f"-L{gone}", "-lgone")
    source = ext / "module.c"
    source.write_text(MODULE_SOURCE)

    recent_source = ext / "recent.c"
    recent_source.write_text("#include <dlfcn.h>\nint recent_value(void) { return dlopen(0, RTLD_NOW) != 0; }\n")

    def c_extension(module: str, function: str, *sources_and_links: str | Path) -> Path:
        out = ext / f"{module}{EXT}"
        run(["gcc", "-shared", "-fPIC", f"-I{PY_INCLUDE}", f"-DMODULE={module}", f"-DVALUE_FN={function}",
             source, *sources_and_links, "-o", out])
        return out

    missing = c_extension("_missing", "gone_value", f"-L{gone}", "-lgone")
    indirect = c_extension("_indirect", "mid_value", f"-L{deps}", "-ltestmid")
    recent = c_extension("_recent", "recent_value", recent_source)
    for leftover in gone.iterdir():  # libgone.so.1 is needed now, and nowhere to be found
        leftover.unlink()
    return Built(deps, fakelink, missing, indirect, recent)


@pytest.fixture(scope="session")
def hip_extensions(built: Built, hipcc: str, hip_targets: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory) -> HipExtensions:
    """The two HIP extension modules, compiled once per session by the local hipcc."""
    ext = tmp_path_factory.mktemp("repair-hip")
    source = ext / "module.hip"
    source.write_text(MODULE_SOURCE)

    def hip_extension(module: str, function: str, library: str, *extra: str) -> Path:
        out = ext / f"{module}{EXT}"
        run([hipcc, "-fPIC", "-shared", *(f"--offload-arch={t}" for t in hip_targets), f"-I{PY_INCLUDE}",
             f"-DMODULE={module}", f"-DVALUE_FN={function}", source, "-o", out, f"-L{built.deps}", f"-l{library}",
             *extra], env=HIP_ENV)
        return out

    # A RUNPATH as a careless build leaves it: a build folder and an empty entry (= the cwd).
    build_runpath = f"-Wl,-rpath,{ext}/build/lib:"
    with ThreadPoolExecutor() as pool:
        kernel = pool.submit(hip_extension, "_kernel", "testdep_value", "testdep")
        linked = pool.submit(hip_extension, "_linked", "fakelink_value", "fakelink", "-Wl,--enable-new-dtags", build_runpath)
        return HipExtensions(kernel.result(), linked.result())


@pytest.fixture(scope="session")
def ld_library_path(built: Built) -> Iterator[None]:
    """The test's libraries are found the way a builder finds its own: through LD_LIBRARY_PATH."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LD_LIBRARY_PATH", str(built.deps))
        yield


@dataclass(frozen=True)
class Repaired:
    raw: Path
    wheel: Path
    wheelhouse: Path


@pytest.fixture(scope="module")
def repaired(
    hip_extensions: HipExtensions, ld_library_path: None, platform_wheel: Callable[..., Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Repaired:
    root = tmp_path_factory.mktemp("repair")
    raw = platform_wheel(root / "raw", "hipext", {
        "hipext/__init__.py": b"",
        f"hipext/_kernel{EXT}": hip_extensions.kernel,
        "hipext/sub/__init__.py": b"",
        f"hipext/sub/_linked{EXT}": hip_extensions.linked,
    })
    wheelhouse = root / "wheelhouse"
    wheel = repair_wheel(raw, wheelhouse, link_packages=[LINK], rocm_lib_dir=ROCM_LIB_DIR, log_file=root / "repair.log")
    return Repaired(raw, wheel, wheelhouse)


def _members(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def _extract(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            target = Path(archive.extract(info, dest))
            if not info.is_dir():
                target.chmod((info.external_attr >> 16) & 0o777 or 0o644)
    return dest


@pytest.mark.hipcc
def test_foreign_library_is_grafted_and_rocm_is_not(repaired: Repaired) -> None:
    members = _members(repaired.wheel)
    grafted = [m for m in members if m.startswith("hipext.libs/")]
    assert any(re.fullmatch(r"hipext\.libs/libtestdep-[0-9a-f]{8}\.so\.1", m) for m in grafted), grafted
    policy = load_policy()
    assert not [m for m in members if policy.is_rocm(m)], "a ROCm library was grafted"
    # libfakelink belongs to another package (link_packages): linked, not copied.
    assert not [m for m in members if "fakelink" in m]


@pytest.mark.hipcc
def test_rpaths_point_at_rocm_the_graft_folder_and_linked_packages(repaired: Repaired, tmp_path: Path) -> None:
    site = _extract(repaired.wheel, tmp_path / "site")
    kernel = read_elf(site / f"hipext/_kernel{EXT}")
    linked = read_elf(site / f"hipext/sub/_linked{EXT}")
    # DT_RPATH on purpose (it also serves dependencies of dependencies); no RUNPATH left over.
    assert kernel.runpath == () and linked.runpath == ()
    assert kernel.rpath == ("$ORIGIN/../hipext.libs", ROCM_LIB_DIR)
    assert linked.rpath == ("$ORIGIN/../../fakepkg/lib", ROCM_LIB_DIR)
    for info in (kernel, linked):
        assert "" not in info.rpath
        assert all(e.startswith("$ORIGIN") or e == ROCM_LIB_DIR for e in info.rpath)


@pytest.mark.hipcc
def test_one_platform_tag_in_name_and_wheel_file(repaired: Repaired) -> None:
    info = check_wheel(repaired.wheel, verify_hashes=True)  # RECORD matches every rewritten member
    assert len(info.platform_tags) == 1
    (tag,) = info.platform_tags
    assert re.fullmatch(r"manylinux_\d+_\d+_\w+", tag), tag
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert info.tags == (f"{python}-{python}-{tag}",)
    assert sorted(repaired.wheelhouse.iterdir()) == [repaired.wheel]  # no temporary file left


@pytest.mark.hipcc
def test_pip_installs_it_and_it_imports_without_ld_library_path(repaired: Repaired, built: Built, tmp_path: Path) -> None:
    site = tmp_path / "site"
    # pip checks the tag against this interpreter and installs by RECORD; no index, no config.
    run([sys.executable, "-m", "pip", "install", "--isolated", "--no-index", "--no-deps", "--disable-pip-version-check",
         "--target", site, repaired.wheel], env={"PIP_CONFIG_FILE": os.devnull})
    (site / "fakepkg" / "lib").mkdir(parents=True)
    (site / "fakepkg" / "lib" / "libfakelink.so").write_bytes(built.fakelink.read_bytes())
    code = "import hipext._kernel as k, hipext.sub._linked as l; print(k.value(), l.value())"
    out = run([sys.executable, "-c", code], env={"PYTHONPATH": str(site), "LD_LIBRARY_PATH": ""}, cwd=tmp_path)
    assert out.output.split() == ["41", "7"]


@pytest.mark.hipcc
def test_requested_platform_is_the_only_tag(repaired: Repaired, ld_library_path: None, tmp_path: Path) -> None:
    (found,) = check_wheel(repaired.wheel).platform_tags
    again = repair_wheel(repaired.raw, tmp_path, link_packages=[LINK], plat=found)
    assert check_wheel(again).platform_tags == (found,)


def test_too_low_platform_fails_cleanly(built: Built, platform_wheel: Callable[..., Path], tmp_path: Path) -> None:
    raw = platform_wheel(tmp_path / "raw", "recentpkg", {f"recentpkg/_recent{EXT}": built.recent})
    wheelhouse = tmp_path / "wheelhouse"
    with pytest.raises(RocwheelsError, match="newer than the requested platform") as failure:
        repair_wheel(raw, wheelhouse, plat=f"manylinux_2_17_{os.uname().machine}")
    assert "plat" in (failure.value.fix or "")
    assert not wheelhouse.exists()


def test_unlocatable_library_names_library_and_file(
    built: Built, ld_library_path: None, platform_wheel: Callable[..., Path], tmp_path: Path,
) -> None:
    raw = platform_wheel(tmp_path / "raw", "brokenpkg", {f"brokenpkg/_missing{EXT}": built.missing})
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    with pytest.raises(RocwheelsError) as failure:
        repair_wheel(raw, wheelhouse)
    message = str(failure.value)
    assert "'libgone.so.1'" in message and f"needed by brokenpkg/_missing{EXT}" in message
    assert "[repair] exclude" in (failure.value.fix or "") and "install it in the builder" in (failure.value.fix or "")
    assert list(wheelhouse.iterdir()) == []


def test_unlocatable_indirect_library_names_the_chain(
    built: Built, ld_library_path: None, platform_wheel: Callable[..., Path], tmp_path: Path,
) -> None:
    raw = platform_wheel(tmp_path / "raw", "brokenpkg", {f"brokenpkg/_indirect{EXT}": built.indirect})
    with pytest.raises(RocwheelsError) as failure:
        repair_wheel(raw, tmp_path / "wheelhouse")
    message = str(failure.value)
    assert "'libgone.so.1'" in message
    assert f"{built.deps / 'libtestmid.so.1'} (pulled in by brokenpkg/_indirect{EXT})" in message
    assert not (tmp_path / "wheelhouse").exists()


def test_excluding_the_unlocatable_library_repairs(
    built: Built, ld_library_path: None, platform_wheel: Callable[..., Path], tmp_path: Path,
) -> None:
    raw = platform_wheel(tmp_path / "raw", "brokenpkg", {f"brokenpkg/_missing{EXT}": built.missing})
    wheel = repair_wheel(raw, tmp_path / "wheelhouse", extra_excludes=["libgone.so*"], extra_rpath=["/opt/gone/lib"])
    site = _extract(wheel, tmp_path / "site")
    # Only an excluded, non-ROCm library is needed: extra_rpath, and no rocm_lib_dir.
    assert read_elf(site / f"brokenpkg/_missing{EXT}").rpath == ("/opt/gone/lib",)


def _broken_wheel(kind: str, folder: Path, raw_zip: Callable[..., Path]) -> Path:
    """A raw wheel damaged the way ``kind`` says; auditwheel would crash or misbehave on each."""
    path = folder / f"bad-1.0-cp311-cp311-linux_{os.uname().machine}.whl"
    if kind == "corrupt zip":
        folder.mkdir(parents=True)
        path.write_bytes(b"PK\x03\x04 this is not a zip archive")
        return path
    return raw_zip(path, {
        "no dist-info": {"bad/__init__.py": b""},
        "RECORD names another dist-info": {
            "bad/__init__.py": b"",
            "bad-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nTag: cp311-cp311-linux_x86_64\n",
            "bad-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: bad\nVersion: 1.0\n",
            "bad-1.0.dist-info/RECORD": b"bad/__init__.py,,\nbad-2.0.dist-info/WHEEL,,\nbad-2.0.dist-info/METADATA,,\n"
                                        b"bad-1.0.dist-info/RECORD,,\n",
        },
        "member with ..": {"bad/../../escape.py": b"", "bad-1.0.dist-info/RECORD": b""},
    }[kind])


@pytest.mark.parametrize("kind", ["corrupt zip", "no dist-info", "RECORD names another dist-info", "member with .."])
def test_broken_wheels_fail_before_auditwheel(
    kind: str, raw_zip: Callable[..., Path], tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    raw = _broken_wheel(kind, tmp_path / "raw", raw_zip)
    wheelhouse = tmp_path / "wheelhouse"
    with caplog.at_level("INFO", logger="rocwheels"), pytest.raises(RocwheelsError) as failure:
        repair_wheel(raw, wheelhouse)
    assert raw.name in str(failure.value) and failure.value.fix
    assert not [r for r in caplog.records if "auditwheel" in r.getMessage()]
    assert not wheelhouse.exists()


@pytest.mark.parametrize(
    ("before", "after", "kept"),
    [
        # the pile from facts.md: the old tag stays, the assigned ones are added
        (("manylinux2014_x86_64",), ("manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_28_x86_64"),
         "manylinux_2_28_x86_64"),
        (("linux_x86_64",), ("manylinux2014_x86_64", "manylinux_2_17_x86_64"), "manylinux_2_17_x86_64"),
        (("linux_x86_64",), ("manylinux_2_34_x86_64",), "manylinux_2_34_x86_64"),
        (("manylinux_2_28_x86_64",), ("manylinux_2_28_x86_64",), "manylinux_2_28_x86_64"),
        (("linux_aarch64",), ("manylinux_2_39_aarch64", "manylinux_2_28_aarch64"), "manylinux_2_39_aarch64"),
    ],
)
def test_one_platform_tag_is_chosen(before: tuple[str, ...], after: tuple[str, ...], kept: str) -> None:
    assert _one_platform_tag(before, after) == kept


def test_wheel_file_tags_are_replaced_in_place() -> None:
    text = ("Wheel-Version: 1.0\nGenerator: x\nRoot-Is-Purelib: false\nTag: py2-none-linux_x86_64\n"
            "Tag: py3-none-linux_x86_64\nTag: py3-none-manylinux_2_17_x86_64\nBuild: 1\n")
    assert _retag(text, "manylinux_2_28_x86_64") == (
        "Wheel-Version: 1.0\nGenerator: x\nRoot-Is-Purelib: false\nTag: py2-none-manylinux_2_28_x86_64\n"
        "Tag: py3-none-manylinux_2_28_x86_64\nBuild: 1\n"
    )


def test_link_package_entries() -> None:
    assert LinkPackage.parse("torch/lib:libtorch*.so, libc10*.so") == LinkPackage("torch/lib", ("libtorch*.so", "libc10*.so"))
    assert LinkPackage.parse("torch/lib:libtorch*.so").provides("libtorch_hip.so")
    for bad in ("torch:torch/lib", "torch/lib", "/usr/lib:libx.so", "../x:libx.so", ":libx.so"):
        with pytest.raises(RocwheelsError, match="link_packages"):
            LinkPackage.parse(bad)


@pytest.mark.parametrize("entry", ["opt/rocm/lib", "", "/opt/rocm/lib:/usr/lib"])
def test_search_paths_must_be_absolute_single_folders(entry: str, tmp_path: Path) -> None:
    with pytest.raises(RocwheelsError, match="search path"):
        repair_wheel(tmp_path / "x.whl", tmp_path / "wheelhouse", rocm_lib_dir=entry)
