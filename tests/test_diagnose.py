"""A failed build reads in one line: the compiler's first error; a local build of another ROCm release is refused."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.build.diagnose import first_error
from pipeline.build.host import host_rocm_version
from pipeline.config.layout import Layout
from pipeline.config.lock import load_lock
from pipeline.wheels import make_wheels
from tests.helpers import ROCWHEELS
from tests.helpers.recipes import recipes_plan

REPO = Path(__file__).resolve().parents[1]

# The shape of a real failing `python -m build` of a HIP extension: the cause far above the traceback.
SETUPTOOLS_LOG = "\n".join(
    [
        "+ .venv/bin/python -m build --wheel --no-isolation --outdir dist src",
        "* Building wheel...",
        "running bdist_wheel",
        "running build_ext",
        "hipcc -fPIC --offload-arch=gfx942 -c rocm_canary/kernel.hip -o build/kernel.o",
        "clang: error: invalid target ID 'gfx942'; format is a processor name followed by an optional colon-delimited list of features followed by an enable/disable sign (e.g., 'gfx908:sramecc+:xnack-')",
        "error: command '/usr/bin/hipcc' failed with exit code 1",
        "Traceback (most recent call last):",
        *[f'  File "/usr/lib/python3/setuptools/x{i}.py", line {i}, in run' for i in range(30)],
        "subprocess.CalledProcessError: Command '['hipcc']' returned non-zero exit status 1.",
        "ERROR Backend subprocess exited when trying to invoke build_wheel",
        "# exit code 1",
    ]
)


def test_the_first_compiler_error_is_the_cause_not_the_traceback() -> None:
    assert (first_error(SETUPTOOLS_LOG) or "").startswith("clang: error: invalid target ID 'gfx942'")


@pytest.mark.parametrize(
    ("log", "cause"),
    [
        (
            "a.cpp:3:1: error: unknown type name 'foo'\nmake: *** [x] Error 1\n",
            "a.cpp:3:1: error: unknown type name 'foo'",
        ),
        (
            "CMake Error at CMakeLists.txt:5 (find_package):\n  not found\n",
            "CMake Error at CMakeLists.txt:5 (find_package):",
        ),
        (
            "x.hip:1:10: fatal error: 'hip/hip_runtime.h' file not found\n",
            "x.hip:1:10: fatal error: 'hip/hip_runtime.h' file not found",
        ),
        (
            "ERROR: No matching distribution found for torch==9.9\n",
            "ERROR: No matching distribution found for torch==9.9",
        ),
        ("error: command 'gcc' failed\nERROR Backend subprocess exited when trying to invoke build_wheel\n", None),
        ("all good\n", None),
    ],
)
def test_first_error(log: str, cause: str | None) -> None:
    assert first_error(log) == cause


@pytest.mark.hipcc
def test_a_failed_compile_is_summarised_by_its_first_error(tmp_path: Path, canary_targets, host_line) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", recipes, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    kernels = sorted((recipes / "rocm-canary").rglob("*.hip"))
    assert kernels, "the canary has a HIP source"
    kernels[0].write_text(kernels[0].read_text() + "\nthis is not C++;\n")
    layout = Layout(recipes, tmp_path / "wheelhouse", tmp_path / "work")
    name, _ = host_line
    plan = recipes_plan(recipes, ["rocm-canary"], name, canary_targets)
    (outcome,) = make_wheels(plan, layout)
    assert outcome.status == "failed"
    assert "error:" in outcome.detail and kernels[0].name in outcome.detail, outcome.detail
    assert "Traceback" not in outcome.detail
    assert not layout.wheelhouse.exists() or not list(layout.wheelhouse.glob("*.whl"))


def test_a_local_build_of_another_rocm_release_is_refused_before_anything_runs(tmp_path: Path) -> None:
    host = host_rocm_version()
    lines = load_lock(REPO / "recipes").lock.lines
    other = next(
        (
            name
            for name, line in lines.items()
            if not line.rocm_wheels and (host is None or not line.rocm.startswith(host))
        ),
    )
    result = subprocess.run(
        [
            *ROCWHEELS,
            "--work-dir",
            str(tmp_path / "work"),
            "--wheelhouse",
            str(tmp_path / "wh"),
            "wheels",
            "--driver",
            "local",
            "--rocm",
            other,
            "--arch",
            lines[other].targets[0],
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"ROCm line {other}" in result.stderr and "DRIVER=container" in result.stderr
    assert not (tmp_path / "work").exists() and not (tmp_path / "wh").exists()
