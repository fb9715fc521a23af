"""Wheels with real HIP extensions, built here, for the repair and verify tests.

The HIP wheel holds two extension modules:
- ``hipext/_kernel``: HIP code that also links ``libtestdep.so.1``, a library of the test's own
  found through LD_LIBRARY_PATH: it must be grafted into ``hipext.libs/``, the HIP runtime not;
- ``hipext/sub/_linked``: HIP code that links ``libfakelink.so`` from another package
  (``fakepkg/lib``, declared in link_packages) and carries a build-machine RUNPATH with an empty
  entry, which auditwheel leaves alone (nothing of it is grafted) and repair must clean.

tests/conftest.py registers the fixtures (``pytest_plugins``); test modules import the rest.
"""

from __future__ import annotations

import sysconfig
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.config.toolchain import HIP_ENV
from pipeline.repair.repair import RepairSettings, repair_wheel
from pipeline.util.cmd import run

EXT = sysconfig.get_config_var("EXT_SUFFIX")
PY_INCLUDE = sysconfig.get_paths()["include"]
ROCM_LIB_DIR = "/opt/rocm/lib"
LINK = "fakepkg/lib:libfakelink.so*"
HIPEXT_VERSION = "1.0+rocm5.2"  # a +rocm label, as rocwheels builds carry

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
    _shared_library(
        deps,
        "libtestmid.so.1",
        "int gone_value(void);\nint mid_value(void) { return gone_value(); }\n",
        f"-L{gone}",
        "-lgone",
    )
    source = ext / "module.c"
    source.write_text(MODULE_SOURCE)

    recent_source = ext / "recent.c"
    recent_source.write_text("#include <dlfcn.h>\nint recent_value(void) { return dlopen(0, RTLD_NOW) != 0; }\n")

    def c_extension(module: str, function: str, *sources_and_links: str | Path) -> Path:
        out = ext / f"{module}{EXT}"
        run(
            [
                "gcc",
                "-shared",
                "-fPIC",
                f"-I{PY_INCLUDE}",
                f"-DMODULE={module}",
                f"-DVALUE_FN={function}",
                source,
                *sources_and_links,
                "-o",
                out,
            ]
        )
        return out

    missing = c_extension("_missing", "gone_value", f"-L{gone}", "-lgone")
    indirect = c_extension("_indirect", "mid_value", f"-L{deps}", "-ltestmid")
    recent = c_extension("_recent", "recent_value", recent_source)
    for leftover in gone.iterdir():  # libgone.so.1 is needed now, and nowhere to be found
        leftover.unlink()
    return Built(deps, fakelink, missing, indirect, recent)


@pytest.fixture(scope="session")
def hip_extensions(
    built: Built, hipcc: str, hip_targets: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory
) -> HipExtensions:
    """The two HIP extension modules, compiled once per session by the local hipcc."""
    ext = tmp_path_factory.mktemp("repair-hip")
    source = ext / "module.hip"
    source.write_text(MODULE_SOURCE)

    def hip_extension(module: str, function: str, library: str, *extra: str) -> Path:
        out = ext / f"{module}{EXT}"
        run(
            [
                hipcc,
                "-fPIC",
                "-shared",
                *(f"--offload-arch={t}" for t in hip_targets),
                f"-I{PY_INCLUDE}",
                f"-DMODULE={module}",
                f"-DVALUE_FN={function}",
                source,
                "-o",
                out,
                f"-L{built.deps}",
                f"-l{library}",
                *extra,
            ],
            env=HIP_ENV,
        )
        return out

    # A RUNPATH as a careless build leaves it: a build folder and an empty entry (= the cwd).
    build_runpath = f"-Wl,-rpath,{ext}/build/lib:"
    with ThreadPoolExecutor() as pool:
        kernel = pool.submit(hip_extension, "_kernel", "testdep_value", "testdep")
        linked = pool.submit(
            hip_extension, "_linked", "fakelink_value", "fakelink", "-Wl,--enable-new-dtags", build_runpath
        )
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
    hip_extensions: HipExtensions,
    ld_library_path: None,
    platform_wheel: Callable[..., Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Repaired:
    root = tmp_path_factory.mktemp("repair")
    raw = platform_wheel(
        root / "raw",
        "hipext",
        {
            "hipext/__init__.py": b"",
            f"hipext/_kernel{EXT}": hip_extensions.kernel,
            "hipext/sub/__init__.py": b"",
            f"hipext/sub/_linked{EXT}": hip_extensions.linked,
        },
        version=HIPEXT_VERSION,
    )
    wheelhouse = root / "wheelhouse"
    wheel = repair_wheel(
        raw, wheelhouse, RepairSettings(link_packages=(LINK,), rocm_lib_dir=ROCM_LIB_DIR), log_file=root / "repair.log"
    )
    return Repaired(raw, wheel, wheelhouse)


def members(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def extract_wheel(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            target = Path(archive.extract(info, dest))
            if not info.is_dir():
                target.chmod((info.external_attr >> 16) & 0o777 or 0o644)
    return dest
