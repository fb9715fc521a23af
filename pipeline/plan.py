"""The plan: which recipes build in which order, each with its resolved build description.

Nothing here runs anything but a probe of the host's hipcc; ``rocwheels plan`` prints a plan
and the build stage executes one. What one recipe's wheels must be is resolved in
:mod:`pipeline.description`.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.build.host import host_rocm_version
from pipeline.build.jobs import BuildProfile, HostCapacity, container_capacity, read_profile
from pipeline.config import lock as lockmod
from pipeline.config.build_constraints import check_constraints
from pipeline.config.layout import Layout
from pipeline.config.lock import Line
from pipeline.config.recipes import LOCK_FILE, RecipeFile, load_recipes
from pipeline.config.targets import GpuTarget, check_supported, parse_targets
from pipeline.description import BuildDescription, at_line, resolve
from pipeline.errors import ConfigError, InputError, RocwheelsError

log = logging.getLogger("rocwheels")


@dataclass(frozen=True)
class Plan:
    line_name: str
    line: Line
    targets: tuple[GpuTarget, ...]
    steps: tuple[BuildDescription, ...] = field(default=())
    driver: str = "local"  # "local" (this host) or "container" (the line's builder image)
    # Recipes built for fewer targets than asked, or left out, when the plan narrows (ci matrix).
    notes: tuple[str, ...] = ()


def running_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def check_known(recipes: dict[str, RecipeFile], wanted: Sequence[str]) -> None:
    """Refuse names in ``wanted`` that no recipe has (a typo in --recipes / RECIPES=)."""
    unknown = [name for name in wanted if name not in recipes]
    if unknown:
        raise InputError(
            f"unknown recipe(s): {', '.join(unknown)}",
            fix=f"known recipes (a NAME.toml each in the recipes folder): {', '.join(recipes)}",
        )


def build_order(recipes: dict[str, RecipeFile], wanted: Sequence[str]) -> list[RecipeFile]:
    """``wanted`` and everything they depend on, dependencies first (load_recipes refused cycles)."""
    check_known(recipes, wanted)
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
    narrow: bool = False,
    profile: BuildProfile | None = None,
    capacity: HostCapacity | None = None,
) -> Plan:
    """Order the recipes, check the targets against the line, resolve each recipe's description.

    ``narrow``: each recipe builds for the requested targets it supports (its fallback's included)
    and the plan notes the rest; a recipe supporting none of them is left out with its dependants.
    Without it a target a recipe cannot build is an error. ``profile`` and ``capacity``: where
    ``jobs`` is None, what decides each recipe's jobs (:func:`pipeline.build.jobs.decide_jobs`).
    """
    check_supported(
        targets,
        line.targets,
        what=f"ROCm line {line_name} (ROCm {line.rocm}; recipes/lock.toml lines.{line_name}.targets)",
    )
    # The local driver builds with the Python running rocwheels, the container with the line's.
    python = line.python if driver == "container" else (running_python(),)
    capacity = capacity or HostCapacity.measure()
    steps: list[BuildDescription] = []
    notes: list[str] = []
    for recipe in build_order(recipes, wanted):
        own_targets = targets
        if narrow:
            own_targets, note = _supported_targets(
                recipe, targets, line_name, line, recipes_dir, {s.name for s in steps}
            )
            if note:
                notes.append(note)
            if not own_targets:
                continue
        steps.append(
            resolve(
                recipes,
                recipe.name,
                line_name=line_name,
                line=line,
                targets=own_targets,
                python=python,
                recipes_dir=recipes_dir,
                jobs=jobs,
                constraints=constraints,
                profile=profile,
                capacity=capacity,
            )
        )
    return Plan(line_name, line, targets, tuple(steps), driver, tuple(notes))


def _supported_targets(
    recipe: RecipeFile,
    targets: tuple[GpuTarget, ...],
    line_name: str,
    line: Line,
    recipes_dir: Path,
    planned: set[str],
) -> tuple[tuple[GpuTarget, ...], str]:
    """The requested targets ``recipe`` builds at the line's version, and a note on the rest."""
    missing = [dep for dep in recipe.depends_on if dep not in planned]
    if missing:
        return (), f"{recipe.name}: left out, it needs {', '.join(missing)}"
    supported = at_line(recipe, line_name, line, recipes_dir).targets.buildable
    kept = tuple(t for t in targets if t.processor in supported)
    dropped = [str(t) for t in targets if t.processor not in supported]
    if not dropped:
        return kept, ""
    if not kept:
        return (), f"{recipe.name}: left out, its recipe supports none of {', '.join(map(str, targets))}"
    return (
        kept,
        f"{recipe.name}: built for {', '.join(map(str, kept))}; its recipe does not support {', '.join(dropped)}",
    )


def describe(plan: Plan) -> str:
    """Human-readable plan for ``rocwheels plan``."""
    lines = [
        f"ROCm line {plan.line_name}: ROCm {plan.line.rocm}, local version +{plan.line.local_version}",
        f"GPU targets: {', '.join(map(str, plan.targets))}",
        f"Python: {', '.join(plan.line.python)} in the container; {running_python()} (this interpreter) with DRIVER=local",
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
        if step.jobs_note:
            lines.append(f"   compile jobs: {step.jobs_note}")
        if step.constraints:
            lines.append(f"   build environment: {step.constraints} (hash-checked)")
        if step.pre:
            lines.append("   pre-build:")
            lines += [f"     $ {command}" for command in step.pre]
        lines.append(f"   build: python -m build {' '.join(step.build_args)} <source>")
        lines.append("   then: repair -> verify -> wheelhouse/")
    return "\n".join(lines)


def plan_document(plan: Plan) -> dict[str, Any]:
    """The plan for machines (``rocwheels plan --json``, CI): every step's whole description."""
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
        "python": list(plan.line.python) if plan.driver == "container" else [running_python()],
        "steps": [step.document() for step in plan.steps],
        "notes": list(plan.notes),
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
    *,
    narrow: bool = False,
    building: bool = False,
) -> Plan:
    """Everything checked before anything runs: recipes, lock, line, targets, order.

    ``arch`` None means every target the line's compiler takes (the demo); ``python`` (X.Y) builds
    for that one of the line's Python versions only (one CI job per Python). ``building``: this
    host builds the plan now, so a local build's ROCm must be the line's (``plan`` and ``ci matrix``
    only describe builds that run elsewhere).
    """
    targets = parse_targets(arch) if arch is not None else None
    all_recipes = load_recipes(layout.recipes_dir)
    check_known(all_recipes, _split(recipes))  # the user's typo before the lock's and the host's checks
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
    if building and driver == "local" and rocm and not line.rocm_wheels:
        _check_host_toolchain(line_name, line, lock_file)
    for warning in lockmod.check_lock(lock_file, all_recipes, warn_for=line_name):
        log.warning("warning: %s", warning)
    constraints = check_constraints(all_recipes, lock_file, line_name)
    wanted = _split(recipes) or list(line.versions)
    targets = targets or line.default_targets
    capacity = HostCapacity.measure()
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
        narrow=narrow,
        profile=read_profile(layout.wheelhouse, line_name),
        capacity=container_capacity(capacity) if driver == "container" else capacity,
    )


def _check_host_toolchain(line_name: str, line: Line, lock_file: lockmod.LockFile) -> None:
    """A local build compiles with this host's ROCm: refuse a line of another release before anything runs
    (a `wheels` line brings its ROCm as pip packages, so any host will do)."""
    host = host_rocm_version()
    if host is None:
        raise InputError(
            f"ROCm line {line_name} builds with DRIVER=local on this host, which has no ROCm toolchain "
            "(no /opt/rocm/.info/version, no hipcc)",
            fix=f"build in the builder image (DRIVER=container ROCM={line_name}), or install ROCm {line.rocm} here",
        )
    if not lockmod.same_release(line.rocm, host):
        own = lockmod.line_for_release(lock_file, host)
        raise InputError(
            f"ROCm line {line_name} is ROCm {line.rocm}, this host's toolchain is ROCm {host}: a local build would "
            "compile with the wrong release (its hipcc may reject the line's GPU targets)",
            fix=f"build it in the builder image (DRIVER=container ROCM={line_name})"
            + (f", or build this host's line (ROCM={own[0]})" if own else ""),
        )


def _for_python(python: str, line_name: str, line: Line, driver: str, recipes_dir: Path) -> Line:
    """The line building for ``python`` alone (the local driver builds with the running Python anyway)."""
    running = running_python()
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
