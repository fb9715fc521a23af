"""The build description: resolved once, the same facts for every stage, and no stage deriving its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pipeline.config.layout import Layout
from pipeline.config.lock import load_lock
from pipeline.config.recipes import load_recipes
from pipeline.config.targets import parse_targets
from pipeline.description import describe_wheel, resolve
from pipeline.verify.provenance import write_record

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
PIPELINE = REPO / "pipeline"


def every_description():
    recipes = load_recipes(RECIPES)
    lock = load_lock(RECIPES)
    for line_name, line in lock.lock.lines.items():
        for name in line.versions:
            yield resolve(recipes, name, line_name=line_name, line=line, targets=None, recipes_dir=RECIPES)


def test_verify_checks_every_pin_repair_writes_against_the_same_layout() -> None:
    checked = 0
    for description in every_description():
        assert description.expect.pins == description.repair.requires_pins, description.name
        assert description.expect.layout == description.repair.target_layout(), description.name
        assert description.expect.platform == description.repair.plat == description.line.platform
        assert description.expect.version == description.wheel_version
        checked += 1
    assert checked > 10


def flash_attention_wheel(folder: Path, line_name: str) -> tuple[Path, str]:
    """An (empty) Triton-backend flash-attention wheel file of ``line_name``, named as the build names it."""
    line = load_lock(RECIPES).line(line_name)
    description = resolve(
        load_recipes(RECIPES),
        "flash-attention",
        line_name=line_name,
        line=line,
        targets=parse_targets("gfx1100"),
        recipes_dir=RECIPES,
    )
    assert not description.recipe.gpu_code, "gfx1100 is built by flash-attention's Triton fallback"
    wheel = folder / f"{description.recipe.dist_name}-{description.wheel_version}-py3-none-any.whl"
    wheel.write_bytes(b"")
    return wheel, description.wheel_version


def test_a_triton_fallback_wheel_found_on_its_own_is_smoke_tested_with_its_variable(tmp_path: Path) -> None:
    wheel, _ = flash_attention_wheel(tmp_path, "rocm7.2")
    layout = Layout(RECIPES, tmp_path, tmp_path / "work")
    description = describe_wheel(layout, wheel, None, None)
    assert description is not None and description.name == "flash-attention"
    assert description.expect.smoke is not None
    assert description.expect.smoke.env == {"FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"}
    assert description.expect.targets is None, "no GPU code: no targets to judge"


def test_a_wheel_with_a_provenance_record_gets_the_recorded_line_and_targets(tmp_path: Path) -> None:
    wheel, version = flash_attention_wheel(tmp_path, "rocm7.2")
    inputs = {"recipe": {"name": "flash-attention"}, "line": {"name": "rocm7.2"}, "targets": ["gfx1100", "gfx1101"]}
    write_record(wheel, "0" * 64, inputs, {"driver": "local"})
    description = describe_wheel(Layout(RECIPES, tmp_path, tmp_path / "work"), wheel, None, None)
    assert description is not None and description.line_name == "rocm7.2"
    assert [str(t) for t in description.targets] == ["gfx1100", "gfx1101"]
    assert description.env["FLASH_ATTENTION_TRITON_AMD_ENABLE"] == "TRUE"
    assert description.wheel_version == version


def test_a_wheel_the_project_cannot_tell_has_no_description(tmp_path: Path) -> None:
    other = tmp_path / "numpy-2.0.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    other.write_bytes(b"")
    assert describe_wheel(Layout(RECIPES, tmp_path, tmp_path / "work"), other, None, None) is None
    assert describe_wheel(Layout(tmp_path / "no-recipes", tmp_path, tmp_path / "work"), other, None, None) is None


# Building these from a recipe or the lock is the description's job alone (pipeline/description.py).
RESOLVED_ONLY_THERE = {"RepairSettings", "Expectations", "TargetLayout", "linked_builds", "requires_dist", "index_urls"}
# Where each is defined (or, for TargetLayout, the defaults of a wheel nobody describes) may build it.
DEFINED_IN = {
    "description.py",
    "repair/repair.py",
    "wheel/analyze.py",
    "repair/pins.py",
    "config/rocm_wheels.py",
    "verify/inspect_table.py",
}


@pytest.mark.parametrize("module", sorted(p.relative_to(PIPELINE).as_posix() for p in PIPELINE.rglob("*.py")))
def test_no_stage_builds_repair_settings_expectations_or_pins_without_the_description(module: str) -> None:
    if module in DEFINED_IN:
        return
    tree = ast.parse((PIPELINE / module).read_text(encoding="utf-8"))
    calls = [
        node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute)
    ]
    derived = sorted(set(calls) & RESOLVED_ONLY_THERE)
    assert not derived, f"pipeline/{module} builds {derived} itself: take them from the BuildDescription"
