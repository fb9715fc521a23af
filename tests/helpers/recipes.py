"""Recipes and plans for tests: a small valid recipe's text, and the canary's plan on a lock line."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pipeline.build.jobs import BuildProfile, HostCapacity
from pipeline.config.layout import Layout
from pipeline.config.lock import Line, load_lock
from pipeline.config.recipes import load_recipes
from pipeline.config.targets import parse_targets
from pipeline.plan import Plan, make_plan
from tests.helpers import REPO


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


# A digest of the right form for a lock line's builder image; no registry is asked for it.
ZERO_DIGEST = "@sha256:" + "0" * 64


def lock_toml(
    versions: dict[str, str],
    *,
    line: str = "l",
    rocm: str = "6.2.4",
    builder_image: str = "localhost/base",
    image_source: str = "test",
    python: tuple[str, ...] = ("3.11",),
    targets: tuple[str, ...] = ("gfx90a", "gfx942"),
) -> str:
    """The text of a lock with one line, the default, pinning ``versions`` (recipe -> version)."""
    return (
        f'default_line = "{line}"\n[lines."{line}"]\nrocm = "{rocm}"\nbuilder_image = "{builder_image}"\n'
        f'image_source = "{image_source}"\npython = {list(python)!r}\ntargets = {list(targets)!r}\n'
        f'[lines."{line}".versions]\n' + "".join(f'{name} = "{version}"\n' for name, version in versions.items())
    ).replace("'", '"')


def rocm99_lock_toml(versions: dict[str, str]) -> str:
    """A lock whose line is a ROCm release that does not exist, its image pinned to a digest no
    registry holds: nothing can be fetched for it by mistake."""
    return lock_toml(
        versions,
        line="rocm9.9",
        rocm="9.9.0",
        builder_image=f"registry.example/rocm/dev{ZERO_DIGEST}",
        image_source="https://example.org/digests",
    )


def recipes_plan(
    recipes_dir: Path,
    wanted: Sequence[str],
    line: str | tuple[str, Line],
    targets: str | Sequence[str],
    *,
    driver: str = "local",
    jobs: int | None = None,
    profile: BuildProfile | None = None,
    capacity: HostCapacity | None = None,
) -> Plan:
    """The plan of ``wanted`` from ``recipes_dir`` for ``targets`` ("a;b" or a sequence), on ``line``:
    the name of a line of that folder's lock, or (name, a lock line changed by the test)."""
    name, lock_line = (line, load_lock(recipes_dir).line(line)) if isinstance(line, str) else line
    return make_plan(
        load_recipes(recipes_dir),
        wanted,
        recipes_dir=recipes_dir,
        line_name=name,
        line=lock_line,
        targets=parse_targets(targets if isinstance(targets, str) else ";".join(targets)),
        driver=driver,
        jobs=jobs,
        profile=profile,
        capacity=capacity,
    )


def canary_plan(layout: Layout, line: tuple[str, Line], targets: tuple[str, ...], driver: str = "local") -> Plan:
    """The plan of rocm-canary alone on ``line`` (name, lock line) for ``targets``."""
    return recipes_plan(layout.recipes_dir, ["rocm-canary"], line, targets, driver=driver)


# The Debian 13 line's canary in the builder container: targets trixie's hipcc 5.7 compiles.
DEBIAN13_TARGETS = ("gfx942", "gfx90a")


def line_plan(layout: Layout, name: str, arch: tuple[str, ...], **line_changes: object) -> Plan:
    """The canary on lock line ``name`` (of the project's recipes, with ``line_changes``) in the container."""
    line = load_lock(REPO / "recipes").line(name).model_copy(update=line_changes)
    return canary_plan(layout, (name, line), arch, driver="container")


def debian13_plan(layout: Layout, **line_changes: object) -> Plan:
    return line_plan(layout, "debian13", DEBIAN13_TARGETS, **line_changes)
