"""A real torch C++ extension (tests/torch_ext) through the whole pipeline, against a real torch.

Built by the local driver of the test-only line ``torch2.13-cpu`` (tests/torch-recipes/), whose
recipe installs PyTorch's CPU wheel of torch 2.13.0 into the build environment as a build wheel;
repaired with ``link_packages`` for torch/lib; verified (including its smoke test: the op runs in
a fresh venv); published to a real pypiserver; installed by pip next to a PyPI-like index that
offers a higher torch. What only a ROCm host can add: the same against a ROCm torch and a GPU.
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from pipeline.analyze import Kind, TargetLayout, analyze_wheel
from pipeline.cmd import run
from pipeline.errors import CommandError
from pipeline.layout import Layout
from pipeline.log import recipe_logger
from pipeline.plan import select_plan
from pipeline.publish import publish
from pipeline.recipes import load_recipes
from pipeline.requirements import exact_requirements
from pipeline.rocm_policy import LinkPackage
from pipeline.serve import add_htpasswd_user, running_pypiserver
from pipeline.sources import fetch_build_wheels
from pipeline.wheels import make_wheels

RECIPES = Path(__file__).parent / "torch-recipes"
LINE = "torch2.13-cpu"
TORCH = ("torch", "2.13.0+cpu")
TORCH_WHEEL = load_recipes(RECIPES)["torch-ext"].build.wheels[0]
TORCH_FILE = Path(urlsplit(TORCH_WHEEL.url).path)
USER, PASSWORD = "builder", "torch-ext-test"

pytestmark = [
    pytest.mark.skipif(not TORCH_FILE.is_file(), reason=f"{TORCH_FILE} is not on this machine (tests/torch-recipes/torch-ext.toml build.wheels)"),
    pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason=f"{TORCH_FILE.name} is for CPython 3.11"),
]


def build_line_recipe(tmp_path: Path, recipe: str) -> tuple[Layout, list]:
    """``recipe`` of the test line through build -> repair -> verify -> wheelhouse (local driver)."""
    layout = Layout(RECIPES, tmp_path / "wheelhouse", tmp_path / "build")
    plan = select_plan(layout, recipe, None, LINE, "local")
    return layout, make_wheels(plan, layout)


def isolated_pip(python: Path, *args: str | Path, check: bool = True):
    """pip for ``python`` that sees only the indexes given here (not this machine's pip settings)."""
    return run([sys.executable, "-m", "pip", "--python", python, "--isolated", "--disable-pip-version-check", *args],
               env={"PIP_CONFIG_FILE": "/dev/null"}, check=check)


def simple_index(root: Path, wheels: list[Path]) -> Path:
    """A PEP 503 index of ``wheels`` in ``root``: one page per project."""
    for wheel in wheels:
        project = root / wheel.name.split("-")[0].replace("_", "-").lower()
        project.mkdir(parents=True, exist_ok=True)
        (project / wheel.name).write_bytes(wheel.read_bytes())
        (project / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    return root


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Layout, Path]:
    layout, outcomes = build_line_recipe(tmp_path_factory.mktemp("torch-ext"), "torch-ext")
    [outcome] = outcomes
    assert outcome.status == "built", f"{outcome.detail} (log: {layout.log_file('torch-ext')})"
    [wheel] = outcome.wheels
    return layout, wheel


@pytest.fixture(scope="module")
def torch_deps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """torch's own dependencies as wheel files, hash-checked from the line's lock (for offline installs)."""
    folder = tmp_path_factory.mktemp("torch-deps")
    run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes", "--only-binary", ":all:",
         "-d", folder, "-r", RECIPES / "constraints" / f"{LINE}.txt"])
    return folder


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, built):
    """A real pypiserver with the verified extension published to it by rocwheels."""
    layout, _ = built
    root = tmp_path_factory.mktemp("pypiserver")
    add_htpasswd_user(root / "htpasswd", USER, PASSWORD)
    with running_pypiserver(root / "packages", root / "htpasswd", log_file=root / "pypiserver.log") as server:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("TWINE_USERNAME", USER)
            env.setenv("TWINE_PASSWORD", PASSWORD)
            result = publish(layout.wheelhouse, server.url)
        assert [w.name for w in result.uploaded] == [built[1].name]
        yield server


def test_extension_links_torch_from_the_installed_torch_and_requires_exactly_it(built):
    layout, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert not [n for n in names if "libtorch" in n or "libc10" in n or ".libs/" in n], "nothing of torch is grafted"
    recipe = load_recipes(RECIPES)["torch-ext"]
    links = tuple(LinkPackage.parse(entry) for entry in recipe.repair.link_packages)
    [extension] = [m for m in analyze_wheel(wheel, TargetLayout(link_packages=links)).members if m.name.startswith("torch_ext/_C")]
    assert extension.search_path == ("$ORIGIN/../torch/lib",)
    torch_libs = {d.soname: d for d in extension.dependencies if d.soname.startswith(("libc10", "libtorch"))}
    assert {"libc10.so", "libtorch_cpu.so"} <= set(torch_libs)
    assert all(d.kind == Kind.PACKAGE and d.location == "torch/lib" for d in torch_libs.values())
    assert exact_requirements(metadata) == dict([TORCH])


def test_torch_libraries_resolve_in_the_installed_layout(built, tmp_path):
    """What the loader does with the installed files: every NEEDED torch library found in torch/lib."""
    _, wheel = built
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    isolated_pip(python, "install", "-q", "--no-compile", "--no-deps", wheel, TORCH_FILE)
    [extension] = (venv / "lib").glob("python3.11/site-packages/torch_ext/_C.*.so")
    resolved = run(["ldd", extension]).output
    for library in ("libc10.so", "libtorch_cpu.so"):
        line = next(line for line in resolved.splitlines() if line.strip().startswith(library))
        assert "site-packages/torch_ext/../torch/lib/" in line, line


@pytest.mark.network
def test_published_extension_installs_with_its_torch_over_a_higher_one_and_runs(built, index, torch_deps, make_wheel, tmp_path):
    """pip sees a higher torch on a PyPI-like index (the CUDA torch's place); the pin picks the line's build."""
    higher = make_wheel(tmp_path / "dist", "torch", "2.15.0", build="pypi")
    pypi = simple_index(tmp_path / "pypi", [higher])
    wheel_dir = fetch_build_wheels(load_recipes(RECIPES)["torch-ext"].at("0.1.0", RECIPES), RECIPES, recipe_logger("torch-ext"))[0].parent
    sources = ["--index-url", pypi.as_uri(), "--extra-index-url", index.simple_url, "--find-links", wheel_dir, "--find-links", torch_deps]
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"

    # Control: without the pin, pip takes the higher torch.
    report = json.loads(isolated_pip(python, "install", "--dry-run", "--quiet", "--report", "-", "--no-deps", *sources, "torch").output)
    assert [item["metadata"]["version"] for item in report["install"]] == ["2.15.0"]

    isolated_pip(python, "install", "-q", "--no-compile", *sources, "torch-ext")
    versions = run([python, "-c", "import importlib.metadata as m; print(m.version('torch'), m.version('torch-ext'))"]).output.split()
    assert versions == [TORCH[1], built[1].name.split("-")[1]]
    result = run([python, "-c", "import torch, torch_ext; print(torch_ext.add_one(torch.tensor([1.0, 41.0])).tolist())"])
    assert result.output.strip().splitlines()[-1] == "[2.0, 42.0]"


@pytest.mark.network
def test_the_pin_refuses_another_torch(built, index, torch_deps, make_wheel, tmp_path):
    """A venv holding another torch: pip will not pair the extension with it (an ABI mismatch at import)."""
    other = make_wheel(tmp_path / "dist", "torch", "2.15.0", build="pypi")
    pypi = simple_index(tmp_path / "pypi", [other])
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    isolated_pip(python, "install", "-q", "--no-deps", other)

    with pytest.raises(CommandError) as refused:
        isolated_pip(python, "install", "-q", "--index-url", pypi.as_uri(), "--extra-index-url", index.simple_url,
                     "--find-links", torch_deps, "torch-ext")
    assert "torch==2.13.0+cpu" in refused.value.output
    assert run([python, "-c", "import importlib.metadata as m; print(m.version('torch'))"]).output.strip() == "2.15.0"
