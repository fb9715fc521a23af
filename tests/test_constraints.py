"""Each line's build environment is locked with hashes; a missing or stale lock stops the plan."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config.build_constraints import (
    _HEADER,
    _input_digest,
    check_constraints,
    compile_constraints,
    constraints_path,
    line_requirements,
)
from pipeline.config.lock import load_lock
from pipeline.config.recipes import load_recipes
from pipeline.errors import ConfigError
from tests.helpers import REPO, ROCWHEELS
from tests.helpers.recipes import lock_toml, recipe_toml

LOCK = lock_toml({"demo": "1.0"}, python=("3.11", "3.12"), targets=("gfx90a",))


@pytest.fixture
def recipes_dir(tmp_path: Path) -> Path:
    (tmp_path / "demo.toml").write_text(
        recipe_toml("demo").replace("[targets]", '[build]\nrequires = ["six"]\n[targets]')
    )
    (tmp_path / "lock.toml").write_text(LOCK)
    return tmp_path


def _check(folder: Path) -> Path:
    return check_constraints(load_recipes(folder), load_lock(folder), "l")


@pytest.mark.network
def test_resolved_with_hashes_then_checked(recipes_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"lock.toml: lines.l: has no build-environment lock") as caught:
        _check(recipes_dir)
    assert "rocwheels lock constraints --rocm l" in str(caught.value)
    path = compile_constraints(load_recipes(recipes_dir), load_lock(recipes_dir), "l")
    assert path == constraints_path(recipes_dir, "l")
    text = path.read_text()
    assert "six==" in text and "build==" in text and "--hash=sha256:" in text
    assert _check(recipes_dir) == path
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")], "no scratch left beside it"
    # What the builds do with it: a hash-checked install, on the pip a fresh venv brings.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "-q", "--require-hashes", "--no-deps", "-r", path], check=True
    )


@pytest.mark.parametrize("change", ["requires", "python"])
def test_stale_lock_names_the_refresh(recipes_dir, change):
    path = constraints_path(recipes_dir, "l")
    path.parent.mkdir()
    shutil.copy(REPO / "recipes" / "constraints" / "debian12.txt", path)  # resolved from other inputs
    with pytest.raises(ConfigError, match="is stale"):
        _check(recipes_dir)
    lines = path.read_text().splitlines()
    # Make it fresh by hand, then change one input: stale again.
    lock_file = load_lock(recipes_dir)
    lines[0] = _HEADER + _input_digest(
        line_requirements(load_recipes(recipes_dir), lock_file, "l"), lock_file.line("l").python
    )
    path.write_text("\n".join(lines) + "\n")
    assert _check(recipes_dir) == path
    if change == "requires":
        (recipes_dir / "demo.toml").write_text(
            (recipes_dir / "demo.toml").read_text().replace('["six"]', '["six", "wheel"]')
        )
    else:
        (recipes_dir / "lock.toml").write_text(LOCK.replace('["3.11", "3.12"]', '["3.11"]'))
    with pytest.raises(ConfigError, match=r"lines.l: .*l.txt is stale") as caught:
        _check(recipes_dir)
    assert "rocwheels lock constraints --rocm l" in str(caught.value)


def test_plan_stops_on_a_stale_lock(tmp_path):
    recipes = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", recipes, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    canary = recipes / "rocm-canary.toml"
    canary.write_text(
        canary.read_text().replace('requires = ["setuptools>=64", "wheel"]', 'requires = ["setuptools>=65", "wheel"]')
    )
    result = subprocess.run(
        [*ROCWHEELS, "--recipes-dir", recipes, "plan", "--arch", "gfx90a", "--rocm", "debian12"],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "debian12.txt is stale" in result.stderr and "rocwheels lock constraints --rocm debian12" in result.stderr
