"""Recipes load into frozen models; every bad input names the file and the field."""

import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline.config.recipes import load_recipe, load_recipes
from pipeline.errors import ConfigError
from tests.helpers import REPO

CANARY = """
name = "demo"
[targets]
env = "ARCHS"
supported = ["gfx90a"]
[smoke]
imports = ["demo"]
[versions."1.0".source]
path = "."
"""


# The canary with one build wheel (str.format: url, sha, isolation).
BUILD_WHEEL = CANARY.replace(
    "[targets]", '[build]\nisolation = {isolation}\nwheels = [{{ url = "{url}", sha256 = "{sha}" }}]\n[targets]'
)


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def test_shipped_recipes_load():
    recipes = load_recipes(REPO / "recipes")
    assert "rocm-canary" in recipes
    canary = recipes["rocm-canary"]
    assert canary.versions["0.1.0"].source.path == "rocm-canary"
    assert canary.targets.prefix == "--offload-arch="
    with pytest.raises(ValidationError):
        canary.name = "other"  # type: ignore[misc]  # frozen: refused at run time as mypy refuses it


def test_version_data_lays_over_the_package(tmp_path):
    text = CANARY.replace("[smoke]", "[env]\nA = '1'\nB = '2'\n[smoke]") + (
        '[versions."2.0"]\nenv = { B = "3" }\ntargets = ["gfx942"]\nrequires = ["ninja"]\n'
        '[versions."2.0".source]\nurl = "https://example.org/demo-2.0.tar.gz"\nsha256 = "' + "a" * 64 + '"\n'
    )
    (tmp_path / "patches" / "demo" / "2.0").mkdir(parents=True)
    (tmp_path / "patches" / "demo" / "2.0" / "02-b.patch").write_text("")
    (tmp_path / "patches" / "demo" / "2.0" / "01-a.patch").write_text("")
    recipe = load_recipe(write(tmp_path, "demo", text))
    old, new = recipe.at("1.0", tmp_path), recipe.at("2.0", tmp_path)
    assert (old.version, old.source.path, old.env, old.targets.supported, old.patches) == (
        "1.0",
        ".",
        {"A": "1", "B": "2"},
        ("gfx90a",),
        (),
    )
    assert (new.version, new.source.url, new.env, new.targets.supported) == (
        "2.0",
        "https://example.org/demo-2.0.tar.gz",
        {"A": "1", "B": "3"},
        ("gfx942",),
    )
    assert new.build.requires == ("ninja",)
    assert new.patches == ("patches/demo/2.0/01-a.patch", "patches/demo/2.0/02-b.patch")


def test_minimal_recipe(tmp_path):
    recipe = load_recipe(write(tmp_path, "demo", CANARY))
    assert recipe.dist_name == "demo"
    assert recipe.build.isolation is True


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("name = 'demo'\nversion = ", "", "not valid TOML"),
        ("colour = 'red'\n" + CANARY, "colour", "unknown key"),
        ("version = '1.0'\n" + CANARY, "version", "unknown key"),
        (CANARY.replace(".source]", '.source]\nbranch = "main"'), "versions.1.0.source.branch", "unknown key"),
        (
            CANARY.replace('path = "."', 'url = "https://example.org/demo-1.0.tar.gz"'),
            "versions.1.0.source.sha256",
            "sha256",
        ),
        (
            CANARY.replace('path = "."', 'git = "https://example.org/demo.git"\ncommit = "abc1234"'),
            "versions.1.0.source.commit",
            "40-hex",
        ),
        (
            CANARY.replace('path = "."', 'path = "."\ngit = "https://example.org/x.git"'),
            "versions.1.0.source.path",
            "exactly one",
        ),
        (CANARY.replace('path = "."', 'path = "nowhere"'), "versions.1.0.source.path", "does not exist"),
        (CANARY.replace('[versions."1.0".source]', '[versions."one".source]'), "versions.one", "PEP 440"),
        (
            CANARY.replace('[versions."1.0".source]', '[versions."1.0+rocm6.2".source]'),
            "versions.1.0+rocm6.2",
            "local part",
        ),
        ("versions = {}\n" + CANARY.split("[versions")[0], "versions", "at least one version"),
        (CANARY.replace('"gfx90a"]', '"gfx90a", "gfx9000"]'), "targets.supported", "gfx9000"),
        (CANARY.replace("[smoke]", "[env]\nX = '{bogus}'\n[smoke]"), "env.X", "{bogus}"),
        (CANARY.replace('[smoke]\nimports = ["demo"]', ""), "smoke", "missing"),
        (CANARY.replace('name = "demo"', 'name = "other"'), "name", "other.toml"),
        (
            BUILD_WHEEL.format(url="file:///w/torch.whl", sha="0" * 64, isolation="false"),
            "build.wheels.0.url",
            "not a wheel file name",
        ),
        (
            BUILD_WHEEL.format(url="file:///w/torch-2.13.0-py3-none-any.whl", sha="ABC", isolation="false"),
            "build.wheels.0.sha256",
            "64 lowercase hex",
        ),
        (
            BUILD_WHEEL.format(url="file:///w/torch-2.13.0-py3-none-any.whl", sha="0" * 64, isolation="true"),
            "build.wheels",
            "isolation = false",
        ),
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
    write(tmp_path, "demo", 'depends_on = ["torch"]\n' + CANARY)
    with pytest.raises(ConfigError, match=r"demo\.toml: depends_on: unknown recipe 'torch'"):
        load_recipes(tmp_path)


def test_lock_is_not_a_recipe(tmp_path):
    shutil.copy(REPO / "recipes" / "lock.toml", tmp_path / "lock.toml")
    write(tmp_path, "demo", CANARY)
    assert list(load_recipes(tmp_path)) == ["demo"]


def test_dependency_cycle(tmp_path):
    write(tmp_path, "a", 'depends_on = ["b"]\n' + CANARY.replace('"demo"', '"a"'))
    write(tmp_path, "b", 'depends_on = ["a"]\n' + CANARY.replace('"demo"', '"b"'))
    with pytest.raises(ConfigError, match=r"a\.toml: depends_on: dependency cycle: a -> b -> a"):
        load_recipes(tmp_path)


def test_two_recipes_one_distribution(tmp_path):
    write(tmp_path, "demo", CANARY)
    write(tmp_path, "demo-too", CANARY.replace('name = "demo"', 'name = "demo-too"\ndistribution = "demo"'))
    with pytest.raises(
        ConfigError, match=r"demo\.toml: distribution: makes demo wheels, as recipes/demo-too\.toml does"
    ):
        load_recipes(tmp_path)


def test_build_wheel_pins_the_exact_build_it_names(tmp_path):
    url = "file:///opt/wheels/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    recipe = load_recipe(write(tmp_path, "demo", BUILD_WHEEL.format(url=url, sha="0" * 64, isolation="false")))
    [wheel] = recipe.build.wheels
    assert wheel.filename == "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert wheel.pin == ("torch", "2.13.0+cpu")


def test_build_wheel_with_another_hash_is_refused_and_not_kept(tmp_path, monkeypatch):
    from pipeline.build.sources import fetch_build_wheels
    from pipeline.util.log import recipe_logger

    monkeypatch.setenv("ROCWHEELS_CACHE", str(tmp_path / "cache"))
    wheel = tmp_path / "torch-2.13.0-py3-none-any.whl"
    wheel.write_bytes(b"not the file the recipe names")
    recipe = load_recipe(
        write(tmp_path, "demo", BUILD_WHEEL.format(url=wheel.as_uri(), sha="0" * 64, isolation="false"))
    )
    with pytest.raises(ConfigError) as caught:
        fetch_build_wheels(recipe.at("1.0", tmp_path), tmp_path, recipe_logger("demo"))
    assert caught.value.field == "build.wheels[0].sha256" and "expects " + "0" * 64 in str(caught.value)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()], "nothing half-checked stays in the cache"
