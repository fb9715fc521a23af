"""Recipes load into frozen models; every bad input names the file and the field."""

import shutil
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.recipes import load_recipe, load_recipes

REPO = Path(__file__).resolve().parents[1]

CANARY = """
name = "demo"
version = "1.0"
[source]
path = "."
[targets]
env = "ARCHS"
supported = ["gfx90a"]
[smoke]
imports = ["demo"]
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def test_shipped_recipes_load():
    recipes = load_recipes(REPO / "recipes")
    assert "rocm-canary" in recipes
    canary = recipes["rocm-canary"]
    assert canary.source.path == "rocm-canary"
    assert canary.targets.prefix == "--offload-arch="
    with pytest.raises(Exception):
        canary.version = "2"  # frozen


def test_minimal_recipe(tmp_path):
    recipe = load_recipe(write(tmp_path, "demo", CANARY))
    assert recipe.dist_name == "demo"
    assert recipe.build.isolation is True


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("name = 'demo'\nversion = ", "", "not valid TOML"),
        ("colour = 'red'\n" + CANARY, "colour", "unknown key"),
        (CANARY.replace("[source]", "[source]\nbranch = 'main'"), "source.branch", "unknown key"),
        (CANARY.replace('path = "."', 'url = "https://example.org/demo-1.0.tar.gz"'), "source.sha256", "sha256"),
        (CANARY.replace('path = "."', 'git = "https://example.org/demo.git"\ncommit = "abc1234"'), "source.commit", "40-hex"),
        (CANARY.replace('path = "."', 'path = "."\ngit = "https://example.org/x.git"'), "source.path", "exactly one"),
        (CANARY.replace('version = "1.0"', "version = 1"), "version", "valid string"),
        (CANARY.replace('version = "1.0"', 'version = "1.0+rocm6.2"'), "version", "local part"),
        (CANARY.replace('"gfx90a"]', '"gfx90a", "gfx9000"]'), "targets.supported", "gfx9000"),
        (CANARY.replace("[smoke]", "[env]\nX = '{bogus}'\n[smoke]"), "env.X", "{bogus}"),
        (CANARY.replace("[smoke]\nimports = [\"demo\"]", ""), "smoke", "missing"),
        (CANARY.replace('name = "demo"', 'name = "other"'), "name", "other.toml"),
    ],
)
def test_bad_recipe_names_file_and_field(tmp_path, text, field, words):
    path = write(tmp_path, "demo", text)
    with pytest.raises(ConfigError) as caught:
        load_recipe(path)
    message = str(caught.value)
    assert str(path) in message
    assert caught.value.field == field
    assert words in message


def test_unknown_dependency(tmp_path):
    write(tmp_path, "demo", CANARY.replace('version = "1.0"', 'version = "1.0"\ndepends_on = ["torch"]'))
    with pytest.raises(ConfigError, match=r"demo\.toml: depends_on: unknown recipe 'torch'"):
        load_recipes(tmp_path)


def test_lock_is_not_a_recipe(tmp_path):
    shutil.copy(REPO / "recipes" / "lock.toml", tmp_path / "lock.toml")
    write(tmp_path, "demo", CANARY)
    assert list(load_recipes(tmp_path)) == ["demo"]
