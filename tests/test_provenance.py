"""Fingerprints decide what is up to date; provenance records travel with accepted wheels."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.config.layout import Layout
from pipeline.verify.provenance import check_record, fingerprints, record_path
from pipeline.wheel.analyze import analyze_wheel
from pipeline.wheels import make_wheels
from tests.helpers import REPO
from tests.helpers.recipes import canary_plan, lock_toml, recipe_toml, recipes_plan
from tests.helpers.wheels import the_build

LOCK = lock_toml({"base": "1.0", "ext": "1.0", "other": "1.0"})


def _prints(folder: Path, arch: str = "gfx90a", driver: str = "local") -> dict[str, str]:
    plan = recipes_plan(folder, ["base", "ext", "other"], "l", arch, driver=driver)
    return {name: value[0] for name, value in fingerprints(plan, folder).items()}


def _recipe(folder: Path, name: str, **kwargs) -> None:
    """A recipe whose source is its own folder ``src-<name>``."""
    (folder / f"src-{name}").mkdir(exist_ok=True)
    (folder / f"{name}.toml").write_text(recipe_toml(name, **kwargs).replace('path = "."', f'path = "src-{name}"'))


@pytest.fixture
def recipes(tmp_path: Path) -> Path:
    _recipe(tmp_path, "base")
    _recipe(tmp_path, "ext", depends_on=("base",))
    _recipe(tmp_path, "other")
    (tmp_path / "lock.toml").write_text(LOCK)
    return tmp_path


def test_a_change_reaches_the_recipe_and_its_dependants_only(recipes):
    before = _prints(recipes)
    assert before == _prints(recipes), "fingerprints are stable"
    _recipe(recipes, "base", env={"EXTRA": "1"})
    after = _prints(recipes)
    assert after["base"] != before["base"] and after["ext"] != before["ext"]
    assert after["other"] == before["other"]


def test_a_changed_pin_rebuilds_that_recipe_and_its_dependants_only(recipes):
    # base describes 1.0 and 1.1 (the same source folder); the lock pins 1.0, then 1.1.
    _recipe(recipes, "base", version="1.1")
    with (recipes / "base.toml").open("a") as recipe:
        recipe.write('[versions."1.0".source]\npath = "src-base"\n')
    before = _prints(recipes)
    (recipes / "lock.toml").write_text(LOCK.replace('base = "1.0"', 'base = "1.1"'))
    after = _prints(recipes)
    assert after["base"] != before["base"] and after["ext"] != before["ext"]
    assert after["other"] == before["other"]


@pytest.mark.parametrize("change", ["arch", "driver", "line", "patch", "source"])
def test_every_input_counts(recipes, change):
    before = _prints(recipes)
    arch, driver = "gfx90a", "local"
    if change == "arch":
        arch = "gfx942"
    elif change == "driver":
        driver = "container"
    elif change == "line":
        (recipes / "lock.toml").write_text(LOCK.replace('python = ["3.11"]', 'python = ["3.11", "3.12"]'))
    elif change == "patch":
        (recipes / "patches" / "base" / "1.0").mkdir(parents=True)
        (recipes / "patches" / "base" / "1.0" / "fix.patch").write_text("--- a/x\n+++ b/x\n")
    else:
        (recipes / "src-base" / "setup.py").write_text("changed")
    after = _prints(recipes, arch, driver)
    assert after["base"] != before["base"] and after["ext"] != before["ext"]


@pytest.mark.hipcc
def test_a_new_arch_rebuilds_instead_of_calling_the_old_wheel_up_to_date(tmp_path, host_line, canary_targets):
    """Build for one target, then ask for another: the new build is made (and, its targets being part
    of its identity, lies beside the first one's variant rather than replacing it)."""
    if len(canary_targets) < 2:
        pytest.skip(f"this hipcc compiles only {canary_targets} of the line's targets")
    first, second = canary_targets[:2]
    layout = Layout(REPO / "recipes", tmp_path / "wheelhouse", tmp_path / "work")
    (built,) = make_wheels(canary_plan(layout, host_line, (first,)), layout)
    assert built.status == "built", built.detail
    (again,) = make_wheels(canary_plan(layout, host_line, (first,)), layout)
    assert again.status == "up to date"
    (rebuilt,) = make_wheels(canary_plan(layout, host_line, (second,)), layout)
    assert rebuilt.status == "built", rebuilt.detail
    wheel = the_build(rebuilt.wheels)
    assert set(layout.wheelhouse.glob("*.whl")) == {*built.wheels, *rebuilt.wheels}
    (extension,) = analyze_wheel(wheel).members
    assert set(extension.gpu_targets) == {second}
    record = json.loads(record_path(wheel).read_text())
    assert record["inputs"]["targets"] == [second] and record["wheel"] == wheel.name
    assert check_record(wheel)[0]


@pytest.mark.hipcc
def test_a_changed_wheel_fails_its_record(tmp_path, host_line, canary_targets):
    layout = Layout(REPO / "recipes", tmp_path / "wheelhouse", tmp_path / "work")
    (built,) = make_wheels(canary_plan(layout, host_line, canary_targets[:1]), layout)
    wheel = the_build(built.wheels)
    copy = tmp_path / "copy" / wheel.name
    copy.parent.mkdir()
    shutil.copy(wheel, copy)
    shutil.copy(record_path(wheel), record_path(copy))
    with copy.open("ab") as stream:
        stream.write(b"\0")
    ok, message = check_record(copy)
    assert not ok and "changed after it was verified" in message
    (rebuilt,) = make_wheels(canary_plan(layout, host_line, canary_targets[:1]), layout)
    assert rebuilt.status == "up to date"
