"""The plan: which recipes build in which order, with what environment and commands.

Nothing here runs anything but a probe of the host's hipcc; ``rocwheels plan`` prints a plan
and the build stage executes one.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from pipeline.build.host import host_rocm_version
from pipeline.config import lock as lockmod
from pipeline.config.build_constraints import check_constraints
from pipeline.config.layout import Layout
from pipeline.config.lock import Line
from pipeline.config.recipes import LOCK_FILE, Recipe, RecipeFile, load_recipes, recipe_path
from pipeline.config.targets import GpuTarget, check_supported, format_targets, parse_targets
from pipeline.errors import ConfigError, RocwheelsError
from pipeline.repair.pins import linked_builds

log = logging.getLogger("rocwheels")


@dataclass(frozen=True)
class Step:
    """One recipe's build: its resolved environment and commands."""

    recipe: Recipe
    wheel_version: str  # what the built wheel must carry: 2.5.1+rocm6.2
    env: dict[str, str]
    pre: tuple[str, ...]
    build_args: tuple[str, ...]
    # (distribution, exact wheel version) of each depends_on recipe, installed before the build.
    dependencies: tuple[tuple[str, str], ...] = ()
    # The line's build-environment lock (recipes/constraints/<line>.txt), installed hash-checked first.
    constraints: Path | None = None
    # A `wheels` line's ROCm (TheRock pip packages), installed into the build environment first.
    rocm_wheels: lockmod.RocmWheels | None = None

    @property
    def name(self) -> str:
        return self.recipe.name


@dataclass(frozen=True)
class Plan:
    line_name: str
    line: Line
    targets: tuple[GpuTarget, ...]
    steps: tuple[Step, ...] = field(default=())
    driver: str = "local"  # "local" (this host) or "container" (the line's builder image)


def build_order(recipes: dict[str, RecipeFile], wanted: Sequence[str]) -> list[RecipeFile]:
    """``wanted`` and everything they depend on, dependencies first (load_recipes refused cycles)."""
    unknown = [name for name in wanted if name not in recipes]
    if unknown:
        raise RocwheelsError(f"unknown recipe(s): {', '.join(unknown)}", fix=f"known recipes: {', '.join(recipes)}")
    ordered: dict[str, RecipeFile] = {}

    def visit(name: str) -> None:
        if name not in ordered:
            for dep in recipes[name].depends_on:
                visit(dep)
            ordered[name] = recipes[name]

    for name in wanted:
        visit(name)
    return list(ordered.values())


def make_plan(
    recipes: dict[str, RecipeFile],
    wanted: Sequence[str],
    *,
    recipes_dir: Path,
    line_name: str,
    line: Line,
    targets: tuple[GpuTarget, ...],
    jobs: int | None = None,
    driver: str = "local",
    constraints: Path | None = None,
) -> Plan:
    """Order the recipes, check the targets against line and recipes, resolve every value."""
    check_supported(
        targets,
        line.targets,
        what=f"ROCm line {line_name} (ROCm {line.rocm}; recipes/lock.toml lines.{line_name}.targets)",
    )
    ordered = [
        for_targets(at_line(recipe, line_name, line, recipes_dir), targets, recipes_dir)
        for recipe in build_order(recipes, wanted)
    ]
    by_name = {recipe.name: recipe for recipe in ordered}
    jobs = jobs or default_jobs()
    steps = tuple(
        _step(
            recipe,
            line,
            targets,
            jobs,
            tuple((by_name[d].dist_name, wheel_version(by_name[d], line)) for d in recipe.depends_on),
            constraints,
        )
        for recipe in ordered
    )
    return Plan(line_name, line, targets, steps, driver)


# Upstream figures agree on about 8 GB per compile job for torch and flash-attention's CK kernels
# (README: "What make wheels ARCH=gfx942 builds on a ROCm 7.2 build host").
GB_PER_JOB = 8


def default_jobs() -> int:
    """Compile jobs when none are asked for: one per core, but no more than memory carries."""
    return jobs_for(len(os.sched_getaffinity(0)), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def jobs_for(cores: int, memory_bytes: int) -> int:
    return max(1, min(cores, memory_bytes // (GB_PER_JOB << 30)))


def at_line(recipe: RecipeFile, line_name: str, line: Line, recipes_dir: Path) -> Recipe:
    """The recipe at the version line ``line_name`` pins."""
    version = line.versions.get(recipe.name)
    if version is None:
        raise RocwheelsError(
            f"recipe {recipe.name} is not pinned in ROCm line {line_name}",
            fix=f"add it to [lines.{line_name}.versions] in recipes/lock.toml, or pick another line (ROCM=...)",
        )
    if version not in recipe.versions:
        raise ConfigError(
            recipes_dir / LOCK_FILE,
            f"lines.{line_name}.versions.{recipe.name}",
            f"{version} is not described in {recipe_path(recipes_dir, recipe.name)}",
            fix=f'add [versions."{version}"] to {recipe_path(recipes_dir, recipe.name)}, or pin one of: {", ".join(recipe.versions)}',
        )
    return recipe.at(version, recipes_dir)


def for_targets(recipe: Recipe, targets: tuple[GpuTarget, ...], recipes_dir: Path) -> Recipe:
    """The recipe as it builds for ``targets``: its fallback when they leave ``supported`` for it."""
    where = f"recipe {recipe.name} {recipe.version} ({recipe_path(recipes_dir, recipe.name)} targets.supported)"
    fallback = recipe.targets.fallback
    if fallback is None or all(t.processor in recipe.targets.supported for t in targets):
        check_supported(targets, recipe.targets.supported, what=where)
        return recipe
    check_supported(targets, (*recipe.targets.supported, *fallback.supported), what=where + " or its targets.fallback")
    log.info(
        "%s: %s need targets.fallback (%s)",
        recipe.name,
        ", ".join(str(t) for t in targets if t.processor not in recipe.targets.supported),
        " ".join(f"{k}={v}" for k, v in fallback.env.items()),
    )
    return recipe.model_copy(
        update={
            "env": {**recipe.env, **fallback.env},
            "smoke": recipe.smoke.model_copy(update={"env": {**recipe.smoke.env, **fallback.env}}),
            "gpu_code": fallback.gpu_code,
        }
    )


def _rocm_values(line: Line) -> dict[str, str]:
    parts = line.rocm.split(".")
    return {
        "rocm": line.rocm,
        "rocm_short": ".".join(parts[:2]),
        "rocm_digits": "".join(parts)[:3],
        "rocm_short_digits": "".join(parts[:2]),
    }


def wheel_version(recipe: Recipe, line: Line) -> str:
    """The exact version a wheel of ``recipe`` built for ``line`` carries: ``2.5.1+rocm6.2``."""
    return f"{recipe.version}+{recipe.local_version.format_map(_rocm_values(line))}"


def _step(
    recipe: Recipe,
    line: Line,
    targets: tuple[GpuTarget, ...],
    jobs: int,
    dependencies: tuple[tuple[str, str], ...],
    constraints: Path | None,
) -> Step:
    version = wheel_version(recipe, line)
    values = {
        **_rocm_values(line),
        "version": recipe.version,
        "local_version": version.split("+", 1)[1],
        "rocm_path": line.rocm_path,
        "targets": format_targets(targets, separator=recipe.targets.separator, prefix=recipe.targets.prefix),
        "jobs": str(jobs),
    }
    env = {
        **({"ROCM_PATH": line.rocm_path} if line.rocm_path else {}),
        **{key: value.format_map(values) for key, value in recipe.env.items()},
        **line.env,
        recipe.targets.env: values["targets"],
    }
    pre = tuple(command.format_map(values) for command in recipe.build.pre)
    args = ("--wheel", *(() if recipe.build.isolation else ("--no-isolation",)), *recipe.build.args)
    return Step(recipe, version, env, pre, args, dependencies, constraints, line.rocm_wheels)


def describe(plan: Plan) -> str:
    """Human-readable plan for ``rocwheels plan``."""
    lines = [
        f"ROCm line {plan.line_name}: ROCm {plan.line.rocm}, local version +{plan.line.local_version}",
        f"GPU targets: {', '.join(map(str, plan.targets))}",
        f"Python: {', '.join(plan.line.python)} in the container; {sys.version_info.major}.{sys.version_info.minor} (this interpreter) with DRIVER=local",
    ]
    for number, step in enumerate(plan.steps, 1):
        recipe = step.recipe
        source = recipe.source.path or recipe.source.url or f"{recipe.source.git}@{recipe.source.commit}"
        lines += ["", f"{number}. {recipe.name} {step.wheel_version}  (source: {source})"]
        if recipe.patches:
            lines.append(f"   patches: {', '.join(recipe.patches)}")
        if recipe.depends_on:
            lines.append(
                f"   after: {', '.join(recipe.depends_on)} (their wheels installed into the build environment)"
            )
        lines.append("   environment:")
        lines += [f"     {key}={value}" for key, value in step.env.items()]
        if step.constraints:
            lines.append(f"   build environment: {step.constraints} (hash-checked)")
        if step.pre:
            lines.append("   pre-build:")
            lines += [f"     $ {command}" for command in step.pre]
        lines.append(f"   build: python -m build {' '.join(step.build_args)} <source>")
        lines.append("   then: repair -> verify -> wheelhouse/")
    return "\n".join(lines)


def plan_document(plan: Plan) -> dict[str, Any]:
    """The plan for machines (``rocwheels plan --json``, CI): everything a build of it runs."""
    return {
        "line": plan.line_name,
        "rocm": plan.line.rocm,
        "local_version": plan.line.local_version,
        "builder_image": plan.line.builder_image,
        "platform": plan.line.platform,
        "rocm_provider": plan.line.rocm_provider,
        **({"rocm_wheels": plan.line.rocm_wheels.model_dump()} if plan.line.rocm_wheels else {}),
        "driver": plan.driver,
        "targets": [str(target) for target in plan.targets],
        "python": list(plan.line.python)
        if plan.driver == "container"
        else [f"{sys.version_info.major}.{sys.version_info.minor}"],
        "steps": [
            {
                "name": step.name,
                "distribution": step.recipe.dist_name,
                "version": step.recipe.version,
                "wheel_version": step.wheel_version,
                "source": step.recipe.source.model_dump(exclude_defaults=True),
                "patches": list(step.recipe.patches),
                "depends_on": list(step.recipe.depends_on),
                "dependencies": [f"{name}=={version}" for name, version in step.dependencies],
                "environment": step.env,
                "requires": list(step.recipe.build.requires),
                "constraints": str(step.constraints.relative_to(step.constraints.parents[1]))
                if step.constraints
                else None,
                "commands": [*step.pre, f"python -m build {' '.join(step.build_args)}"],
                "gpu_code": step.recipe.gpu_code,
            }
            for step in plan.steps
        ],
    }


def _split(value: str | None) -> list[str]:
    return [part for part in re.split(r"[;,\s]+", value or "") if part]


def select_plan(
    layout: Layout,
    recipes: str | None,
    arch: str | None,
    rocm: str | None,
    driver: str,
    jobs: int | None = None,
    python: str | None = None,
) -> Plan:
    """Everything checked before anything runs: recipes, lock, line, targets, order.

    ``arch`` None means every target the line's compiler takes (the demo); ``python`` (X.Y) builds
    for that one of the line's Python versions only (one CI job per Python).
    """
    targets = parse_targets(arch) if arch is not None else None
    all_recipes = load_recipes(layout.recipes_dir)
    lock_file = lockmod.load_lock(layout.recipes_dir)
    host = host_rocm_version() if driver == "local" and not rocm else None
    if driver == "local" and not rocm and host is None:
        raise RocwheelsError(
            "no ROCm toolchain found on this host (no /opt/rocm/.info/version, no hipcc)",
            fix="install ROCm (on Debian: apt-get install hipcc), or build in the container with DRIVER=container",
        )
    line_name, line = lockmod.select_line(lock_file, rocm, host)
    if python is not None:
        line = _for_python(python, line_name, line, driver, layout.recipes_dir)
    for warning in lockmod.check_lock(lock_file, all_recipes, warn_for=line_name):
        log.warning("warning: %s", warning)
    constraints = check_constraints(all_recipes, lock_file, line_name)
    wanted = _split(recipes) or list(line.versions)
    targets = targets or parse_targets(";".join(line.targets))
    return make_plan(
        all_recipes,
        wanted,
        recipes_dir=layout.recipes_dir,
        line_name=line_name,
        line=line,
        targets=targets,
        jobs=jobs,
        driver=driver,
        constraints=constraints,
    )


def _for_python(python: str, line_name: str, line: Line, driver: str, recipes_dir: Path) -> Line:
    """The line building for ``python`` alone (the local driver builds with the running Python anyway)."""
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if driver == "local":
        if python != running:
            raise RocwheelsError(
                f"DRIVER=local builds with the Python running rocwheels ({running}), not {python}",
                fix=f"run rocwheels from a Python {python} venv, or build in the container (DRIVER=container)",
            )
        return line
    if python not in line.python:
        raise ConfigError(
            recipes_dir / LOCK_FILE,
            f"lines.{line_name}.python",
            f"Python {python} is not one of the line's ({', '.join(line.python)})",
            fix=f"pick one of {', '.join(line.python)}, or add {python} to the line",
        )
    return line.model_copy(update={"python": (python,)})


def wheel_origin(layout: Layout, wheel: Path, rocm: str | None) -> tuple[Recipe | None, Line | None]:
    """The recipe that makes this wheel and the lock line it was built for, where they can be told."""
    if not (layout.recipes_dir / LOCK_FILE).is_file():
        return None, None  # outside a rocwheels project (inside the builder image, say)
    try:
        name, version = parse_wheel_filename(wheel.name)[:2]
    except InvalidWheelFilename:
        return None, None  # the stage's own wheel check explains what is wrong with it
    recipes = load_recipes(layout.recipes_dir)
    recipe_file = next((r for r in recipes.values() if r.dist_name == name.replace("-", "_")), None)
    lock_file = lockmod.load_lock(layout.recipes_dir)
    lines = {rocm: lock_file.line(rocm)} if rocm else lock_file.lock.lines
    for line_name, line in lines.items():
        pinned = recipe_file is not None and recipe_file.name in line.versions
        recipe = at_line(recipe_file, line_name, line, layout.recipes_dir) if pinned else None
        label = wheel_version(recipe, line) if recipe else f"{version.public}+{line.local_version}"
        if rocm or label == str(version):
            return recipe, line
    return None, None


def linked_pins(layout: Layout, recipe: Recipe, line: Line) -> tuple[str, ...]:
    """The exact requirements ``recipe``'s wheels built for ``line`` carry (what verify checks)."""
    recipes = load_recipes(layout.recipes_dir)
    dependencies = [
        (dep.dist_name, wheel_version(dep, line))
        for dep in (recipes[name].at(line.versions[name], layout.recipes_dir) for name in recipe.depends_on)
    ]
    return linked_builds(recipe, dependencies)


def label_aliases(layout: Layout) -> dict[str, str]:
    """Local labels packages give themselves -> their line's label (``rocm624`` -> ``rocm6.2``)."""
    if not (layout.recipes_dir / LOCK_FILE).is_file():
        return {}
    recipes = load_recipes(layout.recipes_dir)
    lock_file = lockmod.load_lock(layout.recipes_dir)
    lockmod.check_lock(lock_file, recipes)  # a pin without its recipe is explained, not a KeyError
    aliases = {}
    for line_name, line in lock_file.lock.lines.items():
        for name in line.versions:
            label = wheel_version(at_line(recipes[name], line_name, line, layout.recipes_dir), line).split("+", 1)[1]
            if label != line.local_version:
                aliases[label] = line.local_version
    return aliases
