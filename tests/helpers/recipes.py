"""Recipes and plans for tests: a small valid recipe's text, and the canary's plan on a lock line."""

from __future__ import annotations

from pipeline.config.layout import Layout
from pipeline.config.recipes import load_recipes
from pipeline.config.targets import parse_targets
from pipeline.plan import Plan, make_plan


def recipe_toml(
    name: str,
    version: str = "1.0",
    *,
    depends_on: tuple[str, ...] = (),
    supported: tuple[str, ...] = ("gfx90a", "gfx942"),
    env: dict[str, str] | None = None,
) -> str:
    """The text of a small valid recipe (recipes and plan tests)."""
    env_table = "[env]\n" + "".join(f'{key} = "{value}"\n' for key, value in (env or {}).items()) if env else ""
    return (
        f'name = "{name}"\ndepends_on = {list(depends_on)!r}\n{env_table}'
        f'[targets]\nenv = "PYTORCH_ROCM_ARCH"\nsupported = {list(supported)!r}\n'
        f'[smoke]\nimports = ["{name.replace("-", "_")}"]\n'
        f'[versions."{version}".source]\npath = "."\n'
    ).replace("'", '"')


def canary_plan(layout: Layout, line, targets: tuple[str, ...]) -> Plan:
    """The plan of rocm-canary alone on ``line`` (name, lock line) for ``targets``."""
    name, lock_line = line
    return make_plan(
        load_recipes(layout.recipes_dir),
        ["rocm-canary"],
        recipes_dir=layout.recipes_dir,
        line_name=name,
        line=lock_line,
        targets=parse_targets(";".join(targets)),
    )
