"""The builder image: its tag and build context with a fake engine, then built for real with
podman on a debootstrapped Debian trixie base.

The container tests need root, podman, runc and debootstrap (CI installs them) and the network (Debian
mirror once for the base, PyPI for the builder's tools). They fail, never skip, without podman.
The first run makes the base (~90 s) and the builder (~20 s); later runs reuse both.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from pipeline.build.engine import Engine
from pipeline.build.image import BUILDER_REPOSITORY, PROJECT_ROOT, build_image
from pipeline.errors import RocwheelsError
from pipeline.util.cmd import run
from tests.helpers.wheels import the_build

PYTHON = "3.13"  # trixie's python3
ARCHS = ("gfx90a", "gfx942")


@pytest.fixture
def fake_podman(tmp_path: Path) -> tuple[Engine, Path]:
    """An engine that stores no images and records each build's arguments and Dockerfile."""
    record = tmp_path / "builds"
    record.mkdir()
    script = tmp_path / "podman"
    script.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        [ "$1" = build ] || exit 1
        n=$(ls {record} | wc -l)
        mkdir {record}/$n
        printf '%s\\n' "$@" > {record}/$n/args
        for last; do :; done
        cp -r "$last" {record}/$n/context
    """)
    )
    script.chmod(0o755)
    return Engine("podman", (str(script),), {}), record


def copy_project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    for name in ("docker", "pipeline"):
        shutil.copytree(PROJECT_ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(PROJECT_ROOT / "pyproject.toml", root)
    return root


def test_build_passes_the_build_args_and_stages_the_context(fake_podman: tuple[Engine, Path]) -> None:
    engine, record = fake_podman
    tag = build_image("7.1", "registry.example/rocm@sha256:" + "0" * 64, ["3.12", "3.13"], engine)
    assert tag.startswith(f"{BUILDER_REPOSITORY}:7.1-")
    args = (record / "0" / "args").read_text().splitlines()
    assert args[args.index("--tag") + 1] == tag
    build_args = [args[i + 1] for i, a in enumerate(args) if a == "--build-arg"]
    assert build_args == [
        "BASE_IMAGE=registry.example/rocm@sha256:" + "0" * 64,
        "ROCM_PATH=/opt/rocm",
        "PYTORCH_ROCM_ARCH=gfx90a;gfx942",
        "PYTHON_VERSIONS=3.12 3.13",
    ]
    context = record / "0" / "context"
    assert (context / "Dockerfile").read_text() == (PROJECT_ROOT / "docker" / "Dockerfile.builder").read_text()
    assert (context / "builder" / "provision.sh").is_file()
    assert (context / "rocwheels" / "pyproject.toml").is_file()
    assert (context / "rocwheels" / "pipeline" / "build" / "image.py").is_file()
    assert not list(context.rglob("__pycache__"))
    assert {p.name for p in (context / "constraints").iterdir()} == {
        "constraints-python312.txt",
        "constraints-python313.txt",
    }
    assert (context / "ca-certificates").is_dir()


def test_tag_follows_source_and_build_args(fake_podman: tuple[Engine, Path], tmp_path: Path) -> None:
    engine, _ = fake_podman
    root = copy_project(tmp_path)
    base = "registry.example/rocm@sha256:" + "1" * 64
    first = build_image("7.1", base, ["3.13"], engine, project_root=root)
    assert build_image("7.1", base, ["3.13"], engine, project_root=root) == first
    assert build_image("7.1", base, ["3.13"], engine, project_root=root, rocm_archs=("gfx942",)) != first
    with (root / "pipeline" / "errors.py").open("a") as source:
        source.write("# changed\n")
    assert build_image("7.1", base, ["3.13"], engine, project_root=root) != first


@pytest.mark.parametrize(
    ("line", "pythons", "message"),
    [
        ("7.1/beta", ["3.13"], "cannot start an image tag"),
        ("7.1", ["cp313"], "X.Y strings"),
        ("7.1", [], "X.Y strings"),
        ("7.1", ["3.99"], "no pins for Python 3.99"),
    ],
)
def test_bad_inputs_are_explained(
    fake_podman: tuple[Engine, Path], line: str, pythons: list[str], message: str
) -> None:
    engine, record = fake_podman
    with pytest.raises(RocwheelsError, match=message):
        build_image(line, "base", pythons, engine)
    assert not list(record.iterdir())


@pytest.fixture(scope="module")
def engine(podman_engine: Engine) -> Engine:
    return podman_engine


@pytest.fixture(scope="module")
def builder(engine: Engine, trixie_base: str) -> str:
    # Debian's ROCm lives in /usr: ROCM_PATH stays empty (see Dockerfile.builder).
    return build_image("test", trixie_base, [PYTHON], engine, rocm_path="", rocm_archs=ARCHS)


def in_builder(engine: Engine, image: str, script: str, *options: str) -> str:
    return run(engine.command("run", "--rm", *options, image, "sh", "-ec", script), env=engine.env).output


@pytest.mark.container
def test_tag_names_the_line_and_a_content_hash(builder: str) -> None:
    repository, _, tag = builder.partition(":")
    assert repository == BUILDER_REPOSITORY
    line, _, digest = tag.rpartition("-")
    assert line == "test" and len(digest) == 12 and int(digest, 16) >= 0


@pytest.mark.container
def test_unchanged_inputs_reuse_the_image(engine: Engine, builder: str, trixie_base: str, tmp_path: Path) -> None:
    build_log = tmp_path / "build.log"
    again = build_image("test", trixie_base, [PYTHON], engine, rocm_path="", rocm_archs=ARCHS, log_file=build_log)
    assert again == builder
    assert not build_log.exists(), "nothing should have been built"


@pytest.mark.container
def test_builder_has_pythons_toolchain_and_rocwheels(engine: Engine, builder: str) -> None:
    output = in_builder(
        engine,
        builder,
        """
        echo "python: $(/opt/python/cp313-cp313/bin/python -c 'import sys; print(sys.version_info[:2])')"
        /opt/python/cp313-cp313/bin/pip --version
        /opt/python/cp313-cp313/bin/python -m build --version
        /opt/python/cp313-cp313/bin/python -m virtualenv --version
        echo "utility: $(/opt/python/cp39-cp39/bin/python -c 'print(1 + 1)')"
        /opt/rocwheels-tools/bin/python -c 'import pipeline; print("pipeline imports")'
        auditwheel --version
        patchelf --version
        for tool in gcc g++ cmake ninja ccache; do command -v $tool; done
        echo "HIP_PLATFORM=$HIP_PLATFORM PYTORCH_ROCM_ARCH=$PYTORCH_ROCM_ARCH"
        hipcc --version
        """,
        "--network=none",
    )
    assert "python: (3, 13)" in output
    assert "/opt/python/cp313-cp313/lib/python3.13/site-packages/pip" in output
    assert "utility: 2" in output
    assert "pipeline imports" in output
    assert "auditwheel" in output and "patchelf" in output
    assert "/ccache" in output and "/ninja" in output
    assert "HIP_PLATFORM=amd PYTORCH_ROCM_ARCH=gfx90a;gfx942" in output
    assert "HIP version: 5.7" in output


HIP_EXTENSION = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "hipext"
        version = "0.1.0"
    """,
    # setuptools has no HIP support: compile and link the module with hipcc in one go.
    "setup.py": """
        import os, subprocess, sysconfig
        from setuptools import Extension, setup
        from setuptools.command.build_ext import build_ext

        class HipBuildExt(build_ext):
            def build_extension(self, ext):
                out = self.get_ext_fullpath(ext.name)
                os.makedirs(os.path.dirname(out), exist_ok=True)
                archs = [f"--offload-arch={a}" for a in os.environ["HIPEXT_ARCHS"].split(";")]
                include = "-I" + sysconfig.get_paths()["include"]
                subprocess.check_call(["hipcc", "-O2", "-fPIC", "-shared", *archs, include, *ext.sources, "-o", out])

        setup(ext_modules=[Extension("hipext", ["hipext.hip"])], cmdclass={"build_ext": HipBuildExt})
    """,
    "hipext.hip": """
        #define PY_SSIZE_T_CLEAN
        #include <Python.h>
        #include <hip/hip_runtime.h>

        __global__ void axpy(float a, const float *x, float *y, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[i] += a * x[i];
        }

        static PyObject *device_count(PyObject *, PyObject *) {
            int count = 0;
            hipError_t err = hipGetDeviceCount(&count);
            return Py_BuildValue("(is)", err == hipSuccess ? count : 0, hipGetErrorName(err));
        }

        static PyMethodDef methods[] = {
            {"device_count", device_count, METH_NOARGS, "(devices, status) of hipGetDeviceCount"},
            {nullptr, nullptr, 0, nullptr},
        };
        static PyModuleDef module = {PyModuleDef_HEAD_INIT, "hipext", nullptr, -1, methods};
        PyMODINIT_FUNC PyInit_hipext(void) { return PyModule_Create(&module); }
    """,
}


@pytest.mark.container
def test_cibuildwheel_builds_repairs_and_tests_a_hip_extension(engine: Engine, builder: str, tmp_path: Path) -> None:
    project = tmp_path / "hipext"
    project.mkdir()
    for name, text in HIP_EXTENSION.items():
        (project / name).write_text(textwrap.dedent(text).lstrip())
    wheelhouse = tmp_path / "wheelhouse"
    excludes = " ".join(f"--exclude '{lib}'" for lib in ("libamdhip64.so*", "libhsa-runtime64.so*", "libamd_comgr.so*"))
    settings = {
        "CIBW_PLATFORM": "linux",
        "CIBW_ARCHS": "x86_64",
        "CIBW_BUILD": "cp313-manylinux_x86_64",
        "CIBW_MANYLINUX_X86_64_IMAGE": builder,
        "CIBW_CONTAINER_ENGINE": engine.name,
        "CIBW_ENVIRONMENT": f'HIP_PLATFORM=amd HIPEXT_ARCHS="{";".join(ARCHS)}"',
        "CIBW_REPAIR_WHEEL_COMMAND": f"auditwheel repair --plat manylinux_2_28_x86_64 {excludes} -w {{dest_dir}} {{wheel}}",
        # Imports against the image's own HIP runtime; there is no GPU, so no device.
        "CIBW_TEST_COMMAND": "python -c \"import hipext; print('devices:', hipext.device_count())\"",
    }
    # From inside the project: cibuildwheel copies the working directory into the container.
    result = run(
        [sys.executable, "-m", "cibuildwheel", "--output-dir", wheelhouse],
        env={**engine.env, **settings},
        cwd=project,
        log_file=tmp_path / "cibuildwheel.log",
    )
    assert "devices: (0, 'hipErrorNoDevice')" in (tmp_path / "cibuildwheel.log").read_text(), result.output

    wheel = the_build(wheelhouse.glob("*.whl"))
    assert "manylinux_2_28_x86_64" in wheel.name
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert not [n for n in names if ".libs/" in n], "a ROCm library was grafted into the wheel"
        (module,) = [n for n in names if n.endswith(".so")]
        extracted = Path(archive.extract(module, tmp_path / "unpacked"))
    with extracted.open("rb") as stream:
        elf = ELFFile(stream)
        dynamic = next(s for s in elf.iter_sections() if isinstance(s, DynamicSection))
        # pyelftools names a DT_NEEDED tag's string as the attribute "needed", which its types do not declare.
        needed = {tag.needed for tag in dynamic.iter_tags("DT_NEEDED")}  # type: ignore[attr-defined]
        section = elf.get_section_by_name(".hip_fatbin")
        assert section is not None, f"{module} has no .hip_fatbin section"
        fatbin = section.data()
    assert "libamdhip64.so.5" in needed
    for arch in ARCHS:
        assert f"amdgcn-amd-amdhsa--{arch}".encode() in fatbin
