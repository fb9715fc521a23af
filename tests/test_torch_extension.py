"""A real torch C++ extension (tests/torch-recipes/torch_ext) through the whole pipeline, against a real torch.

Built by the local driver of the test-only line ``torch2.13-cpu`` (tests/helpers/torch_line.py), whose
recipe installs PyTorch's CPU wheel of torch 2.13.0 into the build environment as a build wheel;
repaired with ``link_packages`` for torch/lib; verified (its smoke test runs the op in a fresh
venv); published to a real pypiserver; installed by pip next to a PyPI-like index that offers a
higher torch. What only a ROCm host adds: the same against a ROCm torch, with GPU code.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from pipeline.config.recipes import load_recipes
from pipeline.errors import CommandError
from pipeline.repair.pins import exact_requirements
from pipeline.repair.policy import LinkPackage
from pipeline.util.cmd import run
from pipeline.wheel.analyze import Kind, TargetLayout, analyze_wheel
from tests.helpers.torch_line import (
    RECIPES,
    TORCH,
    TORCH_FILE,
    build_line_recipe,
    download_torch_deps,
    isolated_pip,
    needs_torch_wheel,
    new_venv,
    published,
    simple_index,
    torch_wheel_dir,
)
from tests.helpers.wheels import the_build

# Every test uses the line's build, which downloads its build requirements from PyPI.
pytestmark = [needs_torch_wheel, pytest.mark.network]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    layout, outcome = build_line_recipe(tmp_path_factory.mktemp("torch-ext"), "torch-ext")
    wheel = the_build(outcome.wheels)
    return layout, wheel


@pytest.fixture(scope="module")
def torch_deps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return download_torch_deps(tmp_path_factory.mktemp("torch-deps"))


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, built):
    with published(built[0], tmp_path_factory.mktemp("pypiserver")) as server:
        yield server


def test_extension_links_torch_from_the_installed_torch_and_requires_exactly_it(built):
    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert not [n for n in names if "libtorch" in n or "libc10" in n or ".libs/" in n], "nothing of torch is grafted"
    links = tuple(LinkPackage.parse(entry) for entry in load_recipes(RECIPES)["torch-ext"].repair.link_packages)
    [extension] = [
        m for m in analyze_wheel(wheel, TargetLayout(link_packages=links)).members if m.name.startswith("torch_ext/_C")
    ]
    assert extension.search_path == ("$ORIGIN/../torch/lib",)
    torch_libs = {d.soname: d for d in extension.dependencies if d.soname.startswith(("libc10", "libtorch"))}
    assert {"libc10.so", "libtorch_cpu.so"} <= set(torch_libs)
    assert all(d.kind == Kind.PACKAGE and d.location == "torch/lib" for d in torch_libs.values())
    assert exact_requirements(metadata) == dict([TORCH])


def test_torch_libraries_resolve_in_the_installed_layout(built, tmp_path):
    """What the loader does with the installed files: every NEEDED torch library found in torch/lib."""
    python = new_venv(tmp_path / "venv")
    isolated_pip(python, "install", "-q", "--no-compile", "--no-deps", built[1], TORCH_FILE)
    [extension] = (tmp_path / "venv" / "lib").glob("python3.11/site-packages/torch_ext/_C.*.so")
    resolved = run(["ldd", extension]).output
    for library in ("libc10.so", "libtorch_cpu.so"):
        line = next(line for line in resolved.splitlines() if line.strip().startswith(library))
        assert "site-packages/torch_ext/../torch/lib/" in line, line


def test_published_extension_installs_with_its_torch_over_a_higher_one_and_runs(
    built, index, torch_deps, make_wheel, tmp_path
):
    """pip sees a higher torch on a PyPI-like index (the CUDA torch's place); the pin picks the line's build."""
    pypi = simple_index(tmp_path / "pypi", [make_wheel(tmp_path / "dist", "torch", "2.15.0", build="pypi")])
    sources = [
        "--index-url",
        pypi.as_uri(),
        "--extra-index-url",
        index.simple_url,
        "--find-links",
        torch_wheel_dir("torch-ext"),
        "--find-links",
        torch_deps,
    ]
    python = new_venv(tmp_path / "venv")

    # Control: without the pin, pip takes the higher torch.
    report = json.loads(
        isolated_pip(python, "install", "--dry-run", "--quiet", "--report", "-", "--no-deps", *sources, "torch").output
    )
    assert [item["metadata"]["version"] for item in report["install"]] == ["2.15.0"]

    isolated_pip(python, "install", "-q", "--no-compile", *sources, "torch-ext")
    versions = run(
        [python, "-c", "import importlib.metadata as m; print(m.version('torch'), m.version('torch-ext'))"]
    ).output.split()
    assert versions == [TORCH[1], built[1].name.split("-")[1]]
    result = run(
        [python, "-c", "import torch, torch_ext; print(torch_ext.add_one(torch.tensor([1.0, 41.0])).tolist())"]
    )
    assert result.output.strip().splitlines()[-1] == "[2.0, 42.0]"


def test_the_pin_refuses_another_torch(built, index, torch_deps, make_wheel, tmp_path):
    """A venv holding another torch: pip will not pair the extension with it (an ABI mismatch at import)."""
    other = make_wheel(tmp_path / "dist", "torch", "2.15.0", build="pypi")
    pypi = simple_index(tmp_path / "pypi", [other])
    python = new_venv(tmp_path / "venv")
    isolated_pip(python, "install", "-q", "--no-deps", other)

    with pytest.raises(CommandError) as refused:
        isolated_pip(
            python,
            "install",
            "-q",
            "--index-url",
            pypi.as_uri(),
            "--extra-index-url",
            index.simple_url,
            "--find-links",
            torch_deps,
            "torch-ext",
        )
    assert "torch==2.13.0+cpu" in refused.value.output
    assert run([python, "-c", "import importlib.metadata as m; print(m.version('torch'))"]).output.strip() == "2.15.0"
