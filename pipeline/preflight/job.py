"""One recipe's preflight once its source is laid out, wherever it runs: the build environment,
the pre-build and generate commands, then the sample units compiled per target, each measured alone.

The host makes the :class:`PreflightJob` from the build description (:func:`job_for`); the local
driver runs :func:`preflight_source` with it, the container driver stages it as JSON and runs the
same function in the builder image (``rocwheels preflight-job``).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.build.cache_pass import CompileCommand, cache_pass
from pipeline.build.diagnose import first_error, first_error_in
from pipeline.build.environment import make_environment
from pipeline.build.jobs import HostCapacity, jobs_for
from pipeline.config.models import Model
from pipeline.config.recipes import DEFAULT_UNIT_TIME_LIMIT, Preflight, PreflightSample
from pipeline.config.toolchain import HIP_ENV
from pipeline.description import BuildDescription
from pipeline.errors import CommandError, RocwheelsError
from pipeline.preflight.report import (
    NOT_DESCRIBED,
    REST,
    CacheCheck,
    Capacity,
    Group,
    RecipePreflight,
    Sizing,
    Step,
    UnitResult,
    project,
)
from pipeline.util.cmd import run
from pipeline.util.log import RecipeLogger
from pipeline.wheel.elf import read_elf
from pipeline.wheel.offload import gpu_targets, parse_fatbin

COMPILES = "sample compiles"


class PreflightJob(Model):
    """What one recipe's preflight needs once its source is laid out (made by :func:`job_for`)."""

    recipe: str
    version: str
    line: str
    targets: tuple[str, ...]  # the processors its units are compiled for
    jobs: int
    env: dict[str, str]
    pre: tuple[str, ...]
    python: str  # the interpreter the build environment is made from
    installs: tuple[tuple[str, ...], ...]  # `pip install` arguments, in order
    preflight: Preflight | None
    unit_time_limit: float
    where: str = "on this host"  # where the units compile, for the report: "in the builder container (...)"


def job_for(
    step: BuildDescription,
    *,
    python: str,
    installs: Sequence[Sequence[str]],
    unit_time_limit: float | None,
    where: str = "on this host",
) -> PreflightJob:
    """The preflight job of ``step``: every fact from its description; only where things are differs by driver.

    Units compile for the requested targets the recipe's own [targets] supports; a fallback (another
    backend, say Triton) does not compile them.
    """
    supported = step.recipe.targets.supported
    preflight = step.preflight
    return PreflightJob(
        recipe=step.name,
        version=step.wheel_version,
        line=step.line_name,
        targets=tuple(t.processor for t in step.targets if t.processor in supported) if step.recipe.gpu_code else (),
        jobs=step.jobs,
        env=step.env,
        pre=step.pre,
        python=python,
        installs=tuple(tuple(args) for args in installs),
        preflight=preflight,
        unit_time_limit=unit_time_limit or (preflight.unit_time_limit if preflight else DEFAULT_UNIT_TIME_LIMIT),
        where=where,
    )


@dataclass(frozen=True)
class SampleCompile:
    """One sample unit's compile for one target, as the build would run it (cwd: the source folder)."""

    unit: str
    group: str
    target: str
    argv: tuple[str, ...]
    output: Path


def preflight_source(
    job: PreflightJob, source: Path, work: Path, *, log_file: Path, logger: RecipeLogger
) -> RecipePreflight:
    """Everything a build of ``job`` does after laying out ``source``, then its sample compiles."""
    report = RecipePreflight(recipe=job.recipe, version=job.version, line=job.line, targets=job.targets)
    steps: list[Step] = []
    venv = work / "venv"
    env = {
        **HIP_ENV,
        **job.env,
        "VIRTUAL_ENV": str(venv),
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }

    def shell(commands: Sequence[str]) -> Callable[[], str]:
        def action() -> str:
            for command in commands:
                run(["bash", "-euo", "pipefail", "-c", command], cwd=source, env=env, log_file=log_file, logger=logger)
            return f"{len(commands)} command(s)"

        return action

    # The steps a build of this recipe has (no pre-build step for a recipe without one), in order.
    actions: dict[str, Callable[[], str]] = {
        "build requirements": lambda: _build_environment(job, venv, log_file, logger)
    }
    if job.pre:
        actions["pre-build commands"] = shell(job.pre)
    if job.preflight is not None and job.preflight.generate:
        actions["generate"] = shell(job.preflight.generate)
    for name, action in actions.items():
        steps.append(_timed(name, action, log_file))
        if steps[-1].status == "failed":
            later = [*list(actions)[len(steps) :], *([COMPILES] if job.preflight else [])]
            return report.model_copy(update={"steps": (*steps, *(Step(name=n, status="not run") for n in later))})
    if job.preflight is None:
        return report.model_copy(update={"steps": tuple(steps), "note": NOT_DESCRIBED})
    if not job.targets:
        note = "no requested target is one the recipe's own units compile for (its fallback builds them)"
        return report.model_copy(update={"steps": tuple(steps), "note": note})

    started = time.monotonic()
    try:
        groups, compiles = sample_compiles(job, source, work / "objects", _python_include(venv, logger))
        units = tuple(_compile(one, job, source, env, work, log_file, logger) for one in compiles)
    except RocwheelsError as exc:
        steps.append(Step(name=COMPILES, status="failed", detail=_cause(exc, log_file)))
        return report.model_copy(update={"steps": tuple(steps)})
    failed = sum(not unit.ok for unit in units)
    steps.append(
        Step(
            name=COMPILES,
            status="failed" if failed else "done",
            seconds=time.monotonic() - started,
            detail=f"{len(units) - failed} of {len(units)} compiled",
        )
    )
    compiled = [unit for unit in units if unit.ok]
    return report.model_copy(
        update={
            "steps": tuple(steps),
            "groups": groups,
            "units": units,
            "projection": project(groups, units, job.jobs),
            "sizing": _sizing(job, compiled),
            "cache": _cache_check(
                job, [one for one, unit in zip(compiles, units, strict=True) if unit.ok], source, env, work
            ),
        }
    )


def _sizing(job: PreflightJob, compiled: Sequence[UnitResult]) -> Sizing | None:
    """The jobs the largest measured peak allows here, where the units compiled (in the builder
    container, within its memory limit): what the line's build profile keeps for the builds."""
    if not compiled:
        return None
    here = HostCapacity.measure()
    decision = jobs_for(
        max(unit.peak_rss_bytes for unit in compiled), here, measured=f"measured ({job.recipe} preflight)"
    )
    capacity = Capacity(memory_bytes=here.memory_bytes, cores=here.cores, where=job.where)
    return Sizing(capacity=capacity, jobs=decision.jobs, note=decision.note.replace(here.where, job.where))


def _cache_check(
    job: PreflightJob, compiles: Sequence[SampleCompile], source: Path, env: dict[str, str], work: Path
) -> CacheCheck | None:
    """The compiled sample twice more through a fresh cache of the kind the build uses: the second pass's hits."""
    if not compiles:
        return None
    commands = [CompileCommand(one.unit, one.argv, source, env) for one in compiles]
    try:
        checked = cache_pass(commands, work / "cache-pass", line_name=job.line)
    except RocwheelsError as exc:  # no ccache where the units compile: say so, the compiles themselves stand
        return CacheCheck(tool="none", compiles=len(commands), hit_rate=0.0, note=exc.message.splitlines()[0])
    return CacheCheck(tool=checked.tool, compiles=checked.compiles, hit_rate=checked.hit_rate, note=checked.note())


def sample_compiles(
    job: PreflightJob, source: Path, objects: Path, python_include: str
) -> tuple[tuple[Group, ...], list[SampleCompile]]:
    """The recipe's units sorted into its sample groups, and the compiles of each group's sample per target.

    A unit belongs to the first group whose glob takes it, else to the rest (counted, not sampled).
    """
    preflight = job.preflight
    assert preflight is not None
    units = sorted({_relative(path, source) for pattern in preflight.units for path in source.glob(pattern)})
    if not units:
        raise RocwheelsError(
            f"{job.recipe}: no file of the source matches [preflight] units ({', '.join(preflight.units)})",
            fix="check the globs against the source (after generate), relative to the source folder",
        )
    taken = {group.name: {_relative(path, source) for path in source.glob(group.units)} for group in preflight.sample}
    members: dict[str, list[str]] = {group.name: [] for group in preflight.sample}
    rest: list[str] = []
    for unit in units:
        owner = next((name for name, globbed in taken.items() if unit in globbed), None)
        (members[owner] if owner else rest).append(unit)
    groups = [
        Group(name=g.name, units=len(members[g.name]), sampled=_sample(g, members[g.name], source), cheapest=g.cheapest)
        for g in preflight.sample
    ]
    if rest:
        groups.append(Group(name=REST, units=len(rest)))
    extra = [word for name in preflight.env_flags for word in shlex.split(job.env.get(name, ""))]
    compiles = []
    for target in job.targets:
        for group in groups:
            for unit in group.sampled:
                flags = [flag.format(target=target, python_include=python_include) for flag in preflight.flags]
                language = ["-x", preflight.language] if preflight.language and not unit.endswith(".hip") else []
                output = objects / target / f"{unit}.o"
                argv = (preflight.compiler, *flags, *extra, *language, "-c", unit, "-o", str(output))
                compiles.append(SampleCompile(unit, group.name, target, argv, output))
    return tuple(groups), compiles


def _sample(group: PreflightSample, members: list[str], source: Path) -> tuple[str, ...]:
    """The first ``count`` of the group's units (by name) its ``sample`` glob takes, or of all of them."""
    pickable = set(members)
    if group.sample is not None:
        pickable &= {_relative(path, source) for path in source.glob(group.sample)}
    return tuple(sorted(pickable)[: group.count])


def _relative(path: Path, source: Path) -> str:
    return path.relative_to(source).as_posix()


def _compile(
    one: SampleCompile,
    job: PreflightJob,
    source: Path,
    env: dict[str, str],
    work: Path,
    log_file: Path,
    logger: RecipeLogger,
) -> UnitResult:
    """Compile one sample unit under :mod:`pipeline.preflight.measure`, then read its code objects."""
    one.output.parent.mkdir(parents=True, exist_ok=True)
    unit_log = work / "unit-logs" / one.target / f"{one.unit}.log"
    result = unit_log.with_suffix(".json")
    unit_log.parent.mkdir(parents=True, exist_ok=True)
    command = shlex.join(one.argv)
    logger.info("compiling %s for %s (time limit %.0f s)", one.unit, one.target, job.unit_time_limit)
    measure: list[str | os.PathLike[str]] = [
        sys.executable,
        "-m",
        "pipeline.preflight.measure",
        result,
        unit_log,
        str(job.unit_time_limit),
        "--",
    ]
    run([*measure, *one.argv], cwd=source, env=env, log_file=log_file, logger=logger, quiet=True)
    output = unit_log.read_text(encoding="utf-8", errors="replace")
    with log_file.open("a", encoding="utf-8") as sink:
        sink.write(f"# {one.unit} for {one.target}: {command}\n{output}")
    measured = json.loads(result.read_text(encoding="utf-8"))
    fields = {
        "unit": one.unit,
        "group": one.group,
        "target": one.target,
        "seconds": measured["seconds"],
        "peak_rss_bytes": measured["peak_rss_bytes"],
        "command": command,
    }
    if measured["stopped"]:
        detail = f"stopped after {job.unit_time_limit:g} s: {command}"
        unit = UnitResult(**fields, status="stopped", detail=detail)
    elif measured["returncode"] != 0:
        detail = first_error(output) or f"exit code {measured['returncode']}: {command}"
        unit = UnitResult(**fields, status="failed", detail=detail)
    else:
        found = _code_objects(one.output)
        if one.target in found:
            return UnitResult(**fields, status="compiled", code_objects=found)
        detail = f"no code object for {one.target} in {one.output.name} (found: {', '.join(found) or 'none'})"
        unit = UnitResult(**fields, status="no code object", detail=detail, code_objects=found)
    logger.warning("%s for %s: %s", one.unit, one.target, unit.detail)
    return unit


def _code_objects(output: Path) -> tuple[str, ...]:
    """The GPU processors of the object's code objects, read as verify reads a wheel's libraries."""
    fatbin = read_elf(output).hip_fatbin
    return gpu_targets(parse_fatbin(fatbin)) if fatbin else ()


def _build_environment(job: PreflightJob, venv: Path, log_file: Path, logger: RecipeLogger) -> str:
    make_environment(job.python, venv, job.installs, log_file=log_file, logger=logger)
    return f"{len(job.installs)} install(s)"


def _python_include(venv: Path, logger: RecipeLogger) -> str:
    code = "import sysconfig; print(sysconfig.get_paths()['include'])"
    return run([venv / "bin" / "python", "-c", code], logger=logger, quiet=True).output.strip()


def _timed(name: str, action: Callable[[], str], log_file: Path) -> Step:
    started = time.monotonic()
    try:
        detail = action()
    except RocwheelsError as exc:
        return Step(name=name, status="failed", seconds=time.monotonic() - started, detail=_cause(exc, log_file))
    return Step(name=name, status="done", seconds=time.monotonic() - started, detail=detail)


def _cause(exc: RocwheelsError, log_file: Path) -> str:
    """A failed command's first error (from the log), else the message's first line."""
    found = first_error_in(log_file) if isinstance(exc, CommandError) else None
    return found or exc.message.splitlines()[0]
