"""The real flash-attention sdist through the pipeline: Triton backend, against a real torch.

The test line's gfx1100 is outside the CK kernels' targets, so the recipe's ``[targets.fallback]``
builds the Triton backend: a pure-Python wheel, built with torch importable (torch 2.13.0 CPU as a
build wheel). Verified, published to pypiserver, installed with its exact torch pin. What a ROCm
host adds (a ROCm triton, a GPU, the CK backend for gfx90a/gfx942/gfx950) is in the README.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from pipeline.config.lock import load_lock
from pipeline.config.recipes import load_recipes
from pipeline.repair.pins import exact_requirements
from pipeline.util.cmd import run
from tests.helpers.torch_line import (
    LINE,
    RECIPES,
    TORCH,
    build_line_recipe,
    download_torch_deps,
    isolated_pip,
    needs_torch_wheel,
    new_venv,
    published,
    torch_wheel_dir,
)
from tests.helpers.wheels import the_build

SHIPPED = Path(__file__).parents[1] / "recipes"
BACKEND = {"FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"}


def test_the_test_recipe_builds_the_shipped_source_with_the_shipped_settings():
    version = load_lock(RECIPES).line(LINE).versions["flash-attention"]
    test, shipped = load_recipes(RECIPES)["flash-attention"], load_recipes(SHIPPED)["flash-attention"]
    assert test.versions[version].source == shipped.versions[version].source
    assert test.env == shipped.env
    assert test.targets.fallback is not None and shipped.targets.fallback is not None
    assert test.targets.fallback.env == shipped.targets.fallback.env == BACKEND
    assert test.targets.supported == shipped.targets.supported  # CK: what make wheels builds on a ROCm host
    assert test.repair == shipped.repair


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    layout, outcome = build_line_recipe(tmp_path_factory.mktemp("flash-attention"), "flash-attention")
    wheel = the_build(outcome.wheels)
    return layout, wheel


@needs_torch_wheel
@pytest.mark.network  # the line's build downloads its build requirements from PyPI
def test_triton_backend_wheel_is_pure_python_and_pinned_to_its_torch(built):
    _, wheel = built
    assert wheel.name.startswith("flash_attn-2.8.3.post2+rocm5.2-") and wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "flash_attn/flash_attn_triton_amd/interface_fa.py" in names
    assert not [n for n in names if n.endswith(".so")], "the Triton backend compiles nothing at build time"
    assert exact_requirements(metadata) == dict([TORCH])
    assert "Requires-Dist: einops" in metadata.splitlines()


@needs_torch_wheel
@pytest.mark.network
def test_published_wheel_installs_with_its_torch_and_imports_up_to_triton(built, tmp_path):
    layout, _ = built
    with published(layout, tmp_path / "pypiserver") as index:
        python = new_venv(tmp_path / "venv")
        isolated_pip(
            python,
            "install",
            "-q",
            "--no-compile",
            "--index-url",
            index.simple_url,
            "--find-links",
            torch_wheel_dir("flash-attention"),
            "--find-links",
            download_torch_deps(tmp_path / "deps"),
            "flash-attn",
        )
    versions = run(
        [python, "-c", "import importlib.metadata as m; print(m.version('torch'), m.version('flash-attn'))"]
    ).output.split()
    assert versions == [TORCH[1], "2.8.3.post2+rocm5.2"]

    # With the backend variable the import reaches the Triton backend: a ROCm host adds its triton here.
    triton = run([python, "-c", "import flash_attn"], env=BACKEND, check=False)
    assert triton.returncode == 1 and "No module named 'triton'" in triton.output
    # Without it, flash_attn looks for the CK extension, which this build does not have.
    ck = run([python, "-c", "import flash_attn"], env={"FLASH_ATTENTION_TRITON_AMD_ENABLE": "FALSE"}, check=False)
    assert ck.returncode == 1 and "No module named 'flash_attn_2_cuda'" in ck.output
