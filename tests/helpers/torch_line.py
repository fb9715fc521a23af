"""The test-only lock line ``torch2.13-cpu`` (tests/torch-recipes/): extensions built by the
pipeline against PyTorch's CPU wheel of torch 2.13.0, taken from a local file.

Shared by tests/test_torch_extension.py and tests/test_flash_attention.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from pipeline.build.sources import fetch_build_wheels
from pipeline.config.layout import Layout
from pipeline.config.lock import load_lock
from pipeline.config.recipes import load_recipes
from pipeline.plan import select_plan
from pipeline.publish.serve import RunningIndex, add_htpasswd_user, running_pypiserver
from pipeline.publish.upload import publish
from pipeline.util.cmd import Result, run
from pipeline.util.log import recipe_logger
from pipeline.wheels import Outcome, make_wheels
from tests.helpers import REPO

RECIPES = REPO / "tests" / "torch-recipes"
LINE = "torch2.13-cpu"
TORCH = ("torch", "2.13.0+cpu")
TORCH_FILE = Path(urlsplit(load_recipes(RECIPES)["torch-ext"].build.wheels[0].url).path)
USER, PASSWORD = "builder", "torch-line-test"

# The torch wheel lies on the project's machines and CI's; elsewhere these tests say why they skip.
needs_torch_wheel = pytest.mark.skipif(
    not TORCH_FILE.is_file() or sys.version_info[:2] != (3, 11),
    reason=f"needs {TORCH_FILE} (tests/torch-recipes/*.toml build.wheels) and CPython 3.11, which that wheel is for",
)


def build_line_recipe(root: Path, recipe: str) -> tuple[Layout, Outcome]:
    """``recipe`` of the test line through build -> repair -> verify -> wheelhouse (local driver)."""
    layout = Layout(RECIPES, root / "wheelhouse", root / "build")
    [outcome] = make_wheels(select_plan(layout, recipe, None, LINE, "local"), layout)
    assert outcome.status == "built", f"{outcome.detail} (log: {layout.log_file(recipe)})"
    return layout, outcome


def torch_wheel_dir(recipe: str) -> Path:
    """The folder of the cached, hash-checked torch wheel (a --find-links source)."""
    return fetch_build_wheels(
        load_recipes(RECIPES)[recipe].at(_version(recipe), RECIPES), RECIPES, recipe_logger(recipe)
    )[0].parent


def _version(recipe: str) -> str:
    return load_lock(RECIPES).line(LINE).versions[recipe]


def download_torch_deps(folder: Path) -> Path:
    """torch's own dependencies as wheel files, hash-checked from the line's lock (for offline installs)."""
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--require-hashes",
            "--only-binary",
            ":all:",
            "-d",
            folder,
            "-r",
            RECIPES / "constraints" / f"{LINE}.txt",
        ]
    )
    return folder


@contextmanager
def published(project: Layout, root: Path) -> Iterator[RunningIndex]:
    """A real pypiserver holding the project's wheelhouse, uploaded by rocwheels' publish (twine)."""
    add_htpasswd_user(root / "htpasswd", USER, PASSWORD)
    with running_pypiserver(root / "packages", root / "htpasswd", log_file=root / "pypiserver.log") as server:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("TWINE_USERNAME", USER)
            env.setenv("TWINE_PASSWORD", PASSWORD)
            publish(project.wheelhouse, server.url, project=project)
        yield server


def new_venv(folder: Path) -> Path:
    """An empty venv; returns its python."""
    run([sys.executable, "-m", "venv", "--without-pip", folder])
    return folder / "bin" / "python"


def isolated_pip(python: Path, *args: str | Path) -> Result:
    """pip for ``python`` that sees only the indexes given here (not this machine's pip settings)."""
    return run(
        [sys.executable, "-m", "pip", "--python", python, "--isolated", "--disable-pip-version-check", *args],
        env={"PIP_CONFIG_FILE": "/dev/null"},
    )


def simple_index(root: Path, wheels: list[Path]) -> Path:
    """A PEP 503 index of ``wheels`` in ``root``: one page per project."""
    for wheel in wheels:
        project = root / wheel.name.split("-")[0].replace("_", "-").lower()
        project.mkdir(parents=True, exist_ok=True)
        (project / wheel.name).write_bytes(wheel.read_bytes())
        (project / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    return root
