"""The build description: everything the stages need to know about one recipe's wheels, resolved once.

:func:`resolve` turns (recipe, lock line, GPU targets, Python versions) into a frozen
:class:`BuildDescription`: the wheel's version and file name, the build environment and commands,
the repair settings, what verify expects and the smoke test's environment. Every stage takes the
description; none works these facts out of a recipe or the lock on its own. A wheel found on its
own (standalone ``repair`` / ``verify``) gets one from its provenance record or, failing that,
from the lock by its local label: :func:`describe_wheel`, through :func:`resolve` again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename

from pipeline.build.jobs import BuildProfile, HostCapacity, decide_jobs
from pipeline.config import lock as lockmod
from pipeline.config.layout import Layout
from pipeline.config.lock import Line, rocm_values
from pipeline.config.recipes import (
    LOCK_FILE,
    UNIT_PLACEHOLDERS,
    Preflight,
    Recipe,
    RecipeFile,
    load_recipes,
    recipe_path,
)
from pipeline.config.rocm_wheels import index_urls, link_packages, requires_dist
from pipeline.config.targets import GpuTarget, check_supported, format_targets, parse_targets
from pipeline.config.toolchain import python_tag
from pipeline.errors import ConfigError, RocwheelsError
from pipeline.repair.pins import linked_builds
from pipeline.repair.repair import RepairSettings
from pipeline.verify.verify import Expectations
from pipeline.wheel.archive import parse_wheel_name
from pipeline.wheel.variant import WheelVariant, served_processors, variant_label
from pipeline.wheel.zipwrite import ZIP_EPOCH

log = logging.getLogger("rocwheels")


@dataclass(frozen=True)
class BuildDescription:
    """One recipe's wheels on one lock line, for given GPU targets and Python versions."""

    recipe: Recipe  # at the line's version, with its targets.fallback applied where the targets need it
    line_name: str
    line: Line
    targets: tuple[GpuTarget, ...]
    python: tuple[str, ...]  # X.Y, one wheel each
    wheel_version: str  # what the built wheel must carry: 2.5.1+rocm6.2
    env: dict[str, str]
    pre: tuple[str, ...]
    build_args: tuple[str, ...]
    # (distribution, exact wheel version) of each depends_on recipe, installed before the build.
    dependencies: tuple[tuple[str, str], ...]
    # The line's build-environment lock (recipes/constraints/<line>.txt), installed hash-checked first.
    constraints: Path | None
    repair: RepairSettings
    expect: Expectations  # what verify checks, the smoke test's environment and requirements included
    timeout_minutes: int  # a CI job's time limit for building, repairing and verifying one Python's wheel
    # How the recipe's translation units are compiled, its generate commands and flags filled in
    # (only the per-unit placeholders left); None where the recipe does not say.
    preflight: Preflight | None = None
    # The PEP 825 variant the wheels are published as (label, amd :: gfx_arch values); None for a
    # wheel without GPU code or whose targets are not known.
    variant: WheelVariant | None = None
    # {jobs} (MAX_JOBS): --jobs, else the line's build profile and the capacity where the build
    # runs; the note says why fewer than the cores where memory decided.
    jobs: int = 1
    jobs_note: str = ""

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def rocm_wheels(self) -> lockmod.RocmWheels | None:
        """A `wheels` line's ROCm (TheRock pip packages), installed into the build environment first."""
        return self.line.rocm_wheels

    def wheel_filename(self, python: str) -> str:
        """The file name the wheel for ``python`` (X.Y) must get; ``*`` where auditwheel picks the platform."""
        tag = python_tag(python)
        return f"{self.recipe.dist_name}-{self.wheel_version}-{tag}-{tag}-{self.line.platform or '*'}.whl"

    def document(self) -> dict[str, Any]:
        """The description as JSON data: ``plan --json``, the expected plans, the container's settings file."""
        expect = self.expect
        return {
            "name": self.name,
            "distribution": self.recipe.dist_name,
            "version": self.recipe.version,
            "wheel_version": self.wheel_version,
            "wheel_files": [self.wheel_filename(python) for python in self.python],
            "line": self.line_name,
            "targets": [str(target) for target in self.targets],
            "python": list(self.python),
            "source": self.recipe.source.model_dump(exclude_defaults=True),
            "patches": list(self.recipe.patches),
            "depends_on": list(self.recipe.depends_on),
            "dependencies": [f"{name}=={version}" for name, version in self.dependencies],
            "environment": self.env,
            "requires": list(self.recipe.build.requires),
            "constraints": str(self.constraints.relative_to(self.constraints.parents[1])) if self.constraints else None,
            "commands": [*self.pre, f"python -m build {' '.join(self.build_args)}"],
            "gpu_code": self.recipe.gpu_code,
            "variant": (
                {
                    "label": self.variant.label,
                    "gfx_arch": list(self.variant.processors),
                    "plain": self.variant.plain,
                }
                if self.variant
                else None
            ),
            "timeout_minutes": self.timeout_minutes,
            "jobs": self.jobs,
            "preflight": self.preflight.model_dump(mode="json") if self.preflight else None,
            "repair": self.repair.document(),
            "verify": {
                "targets": list(expect.targets) if expect.targets is not None else None,
                "version": expect.version,
                "platform": expect.platform,
                "pins": list(expect.pins),
                "smoke": expect.smoke.model_dump(mode="json") if expect.smoke else None,
                "index_urls": list(expect.index_urls),
            },
        }

    def write(self, path: Path) -> Path:
        """The description as a JSON file (what ``rocwheels repair --settings`` reads in the container)."""
        path.write_text(json.dumps(self.document(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return path


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
    check_supported(targets, recipe.targets.buildable, what=where + " or its targets.fallback")
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


def wheel_version(recipe: Recipe, line: Line) -> str:
    """The exact version a wheel of ``recipe`` built for ``line`` carries: ``2.5.1+rocm6.2``."""
    return f"{recipe.version}+{recipe.local_version.format_map(rocm_values(line))}"


def resolve(
    recipes: Mapping[str, RecipeFile],
    name: str,
    *,
    line_name: str,
    line: Line,
    targets: tuple[GpuTarget, ...] | None,
    python: tuple[str, ...] | None = None,
    recipes_dir: Path,
    jobs: int | None = None,
    constraints: Path | None = None,
    profile: BuildProfile | None = None,
    capacity: HostCapacity | None = None,
) -> BuildDescription:
    """The one place a recipe, its lock line, the GPU targets and the Python versions become a description.

    ``targets`` None: not known (a wheel found on its own without a record); verify then reports
    the wheel's targets without judging them. ``jobs`` None: from the line's build ``profile``
    and the ``capacity`` where the build runs (None: this host's, measured now).
    """
    recipe = at_line(recipes[name], line_name, line, recipes_dir)
    if targets is not None:
        recipe = for_targets(recipe, targets, recipes_dir)
    version = wheel_version(recipe, line)
    dependencies = tuple(
        (dep.dist_name, wheel_version(dep, line))
        for dep in (at_line(recipes[dep_name], line_name, line, recipes_dir) for dep_name in recipe.depends_on)
    )
    decision = decide_jobs(name, jobs, profile, capacity or HostCapacity.measure())
    formatted_targets = format_targets(targets or (), separator=recipe.targets.separator, prefix=recipe.targets.prefix)
    values = {
        **rocm_values(line),
        "version": recipe.version,
        "local_version": version.split("+", 1)[1],
        "rocm_path": line.rocm_path,
        "targets": formatted_targets,
        "jobs": str(decision.jobs),
    }
    epoch = ZIP_EPOCH if line.source_date_epoch is None else line.source_date_epoch
    env = {
        **({"ROCM_PATH": line.rocm_path} if line.rocm_path else {}),
        **{key: value.format_map(values) for key, value in recipe.env.items()},
        **line.env,
        recipe.targets.env: formatted_targets,
        # Last: the time the build backend writes into the wheel is the one repair writes too.
        "SOURCE_DATE_EPOCH": str(epoch),
    }
    pins = (*requires_dist(line), *linked_builds(recipe, dependencies))
    repair = RepairSettings(
        excludes=recipe.repair.exclude,
        rocm_lib_dir=line.lib_dir,
        link_packages=(*recipe.repair.link_packages, *link_packages(line)),
        extra_rpath=recipe.repair.rpath,
        plat=line.platform,
        requires_pins=pins,
        source_date_epoch=epoch,
    )
    expect = Expectations(
        layout=repair.target_layout(),
        targets=tuple(t.processor for t in targets) if targets is not None and recipe.gpu_code else None,
        version=version,
        platform=line.platform,
        extra_rpath=repair.extra_rpath,
        smoke=recipe.smoke,
        # The smoke test installs the exact builds next to the wheel (the line's, from the wheelhouse).
        smoke_requirements=linked_builds(recipe, dependencies),
        pins=pins,
        index_urls=index_urls(line),
    )
    return BuildDescription(
        variant=wheel_variant(targets, line) if recipe.gpu_code else None,
        recipe=recipe,
        line_name=line_name,
        line=line,
        targets=targets or (),
        python=python or line.python,
        wheel_version=version,
        env=env,
        pre=tuple(command.format_map(values) for command in recipe.build.pre),
        build_args=("--wheel", *(() if recipe.build.isolation else ("--no-isolation",)), *recipe.build.args),
        dependencies=dependencies,
        constraints=constraints,
        repair=repair,
        expect=expect,
        timeout_minutes=recipe.build.timeout_minutes,
        jobs=decision.jobs,
        jobs_note=decision.note,
        preflight=_resolved_preflight(recipe.preflight, values),
    )


def _resolved_preflight(preflight: Preflight | None, values: Mapping[str, str]) -> Preflight | None:
    """``preflight`` with the plan's placeholders filled in; ``{target}`` and the like stay for each unit."""
    if preflight is None:
        return None
    unit_values = {**values, **{name: "{" + name + "}" for name in UNIT_PLACEHOLDERS}}
    return preflight.model_copy(
        update={
            "generate": tuple(command.format_map(values) for command in preflight.generate),
            "flags": tuple(flag.format_map(unit_values) for flag in preflight.flags),
        }
    )


def wheel_variant(targets: tuple[GpuTarget, ...] | None, line: Line) -> WheelVariant | None:
    """The variant a build for ``targets`` is published as. The build for the line's default targets
    (every target it lists, what a build without ARCH makes) is also the line's plain wheel: the one
    pip and installers without variant support get, with code for every GPU of the line."""
    if not targets:
        return None
    processors = served_processors(t.processor for t in targets)
    plain = set(processors) == set(served_processors(t.processor for t in line.default_targets))
    return WheelVariant(variant_label(processors), processors, plain)


def describe_wheel(
    layout: Layout, wheel: Path, rocm: str | None, targets: tuple[GpuTarget, ...] | None
) -> BuildDescription | None:
    """The description of a wheel found on its own, where the project can tell it; None where it cannot.

    The provenance record beside it names its recipe, line and targets; without one the lock
    line whose label the wheel carries (or ``rocm``) and ``targets`` (None: not judged) decide.
    """
    from pipeline.verify.provenance import record_path

    if not (layout.recipes_dir / LOCK_FILE).is_file():
        return None  # outside a rocwheels project (inside the builder image, say)
    try:
        dist, version = parse_wheel_name(wheel.name)[:2]
    except InvalidWheelFilename:
        return None  # the stage's own wheel check explains what is wrong with it
    recipes = load_recipes(layout.recipes_dir)
    lock_file = lockmod.load_lock(layout.recipes_dir)
    recorded = _recorded_origin(record_path(wheel), recipes, lock_file, rocm)
    if recorded is not None:
        name, line_name, recorded_targets = recorded
        return resolve(
            recipes,
            name,
            line_name=line_name,
            line=lock_file.line(line_name),
            targets=targets if targets is not None else recorded_targets,
            recipes_dir=layout.recipes_dir,
        )
    recipe_file = next((r for r in recipes.values() if r.dist_name == dist.replace("-", "_")), None)
    if recipe_file is None:
        return None
    lines = {rocm: lock_file.line(rocm)} if rocm else lock_file.lock.lines
    for line_name, line in lines.items():
        if recipe_file.name not in line.versions:
            continue
        recipe = at_line(recipe_file, line_name, line, layout.recipes_dir)
        if rocm or wheel_version(recipe, line) == str(version):
            wanted = targets if targets is not None else _fallback_targets(recipe, wheel)
            description = resolve(
                recipes,
                recipe_file.name,
                line_name=line_name,
                line=line,
                targets=wanted,
                recipes_dir=layout.recipes_dir,
            )
            if targets is None and wanted is not None:
                # The fallback's environment applies; which of its targets were asked for is not known.
                return replace(description, expect=replace(description.expect, targets=None))
            return description
    return None


def unknown_wheel(targets: tuple[GpuTarget, ...] | None) -> tuple[RepairSettings, Expectations]:
    """Repair settings and expectations for a wheel the project cannot describe: the defaults (ROCm
    in /opt/rocm/lib, nothing pinned), its GPU targets judged only when given."""
    repair = RepairSettings()
    processors = tuple(t.processor for t in targets) if targets is not None else None
    return repair, Expectations(layout=repair.target_layout(), targets=processors)


def _recorded_origin(
    record: Path, recipes: Mapping[str, RecipeFile], lock_file: lockmod.LockFile, rocm: str | None
) -> tuple[str, str, tuple[GpuTarget, ...] | None] | None:
    """(recipe, line, targets) a wheel's provenance record names, where the project still has them."""
    from pipeline.verify.provenance import Provenance

    if not record.is_file():
        return None
    try:
        inputs: object = Provenance.read(record).inputs  # parsed JSON: its shape is not checked yet
    except RocwheelsError:
        return None  # verify's provenance check reports the unreadable record
    # A record is a file anyone may have edited: a field of another shape names nothing.
    if not isinstance(inputs, dict):
        return None
    recipe, line, recorded = inputs.get("recipe"), inputs.get("line"), inputs.get("targets")
    name = recipe.get("name") if isinstance(recipe, dict) else None
    line_name = line.get("name") if isinstance(line, dict) else None
    if not (isinstance(name, str) and isinstance(line_name, str)):
        return None
    if name not in recipes or line_name not in lock_file.lock.lines or rocm not in (None, line_name):
        return None
    if name not in lock_file.line(line_name).versions:
        return None
    if not recorded:
        return name, line_name, None
    if not (isinstance(recorded, list) and all(isinstance(target, str) for target in recorded)):
        return None
    try:
        return name, line_name, parse_targets(";".join(recorded))
    except RocwheelsError:
        return None  # targets this rocwheels does not know: judged as a wheel without a record


def _fallback_targets(recipe: Recipe, wheel: Path) -> tuple[GpuTarget, ...] | None:
    """For a wheel without GPU code of a recipe whose fallback makes such wheels: the fallback's targets."""
    fallback = recipe.targets.fallback
    platforms = {tag.platform for tag in parse_wheel_name(wheel.name)[3]}
    if fallback is None or fallback.gpu_code or platforms != {"any"}:
        return None
    return parse_targets(";".join(p for p in fallback.supported if p not in recipe.targets.supported))


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
