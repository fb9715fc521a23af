"""``rocwheels wheels --preflight``: each recipe of the plan preflighted on this host or in its
line's builder image, its report kept beside its logs.

Both drivers lay the source out on the host (fetched, hash-checked, patched), as a build does;
then :func:`pipeline.preflight.job.preflight_source` does the rest, here or in the container.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.build.container import builder_image, require_pinned
from pipeline.build.engine import Engine, detect_engine
from pipeline.build.environment import installs_for
from pipeline.build.jobs import CONTAINER_MEMORY, HostCapacity, RecipeProfile, container_capacity, record_profile
from pipeline.build.local import find_wheels
from pipeline.build.sources import fetch_build_wheels, prepare_source
from pipeline.config.layout import Layout, fresh_dir
from pipeline.config.rocm_wheels import BUILDER_ROCM_WHEELS
from pipeline.config.toolchain import python_tag
from pipeline.description import BuildDescription
from pipeline.errors import RocwheelsError
from pipeline.plan import Plan
from pipeline.preflight.job import COMPILES, PreflightJob, job_for, preflight_source
from pipeline.preflight.report import RecipePreflight, Step
from pipeline.util.cmd import run
from pipeline.util.log import recipe_logger

# Inside the builder image: the project folder mounted from the host, and what is staged in it.
CONTAINER_PROJECT = "/project"
HELPERS = ".rocwheels"
JOB = "preflight-job.json"
REPORT = "preflight-report.json"
LOG = "preflight.log"

# One recipe's preflight after its source is laid out: (step, source, work folder, log) -> report.
Runner = Callable[[BuildDescription, Path, Path, Path], RecipePreflight]


def report_path(layout: Layout, recipe: str) -> Path:
    """Where a recipe's last preflight report is kept (JSON), beside its build log."""
    return layout.logs / f"{recipe}.preflight.json"


def log_path(layout: Layout, recipe: str) -> Path:
    return layout.logs / f"{recipe}.preflight.log"


def preflight_plan(
    plan: Plan, layout: Layout, driver: str, *, unit_time_limit: float | None = None, engine: Engine | None = None
) -> list[RecipePreflight]:
    """Preflight every recipe of ``plan``; each report is also written to :func:`report_path`."""
    runner = (
        _local_runner(layout, unit_time_limit)
        if driver == "local"
        else _container_runner(plan, layout, unit_time_limit, engine)
    )
    reports = []
    for step in plan.steps:
        report = preflight_recipe(step, layout, runner)
        report.write(report_path(layout, step.name))
        _keep_profile(report, layout)
        reports.append(report)
    return reports


def _keep_profile(report: RecipePreflight, layout: Layout) -> None:
    """The units' measured peak memory, kept in the line's build profile: the jobs of its next builds."""
    compiled = [unit for unit in report.units if unit.ok]
    if not compiled or report.sizing is None:
        return
    where = report.sizing.capacity
    capacity = HostCapacity(memory_bytes=where.memory_bytes, cores=where.cores, where=where.where)
    record_profile(
        layout.wheelhouse, report.line, report.recipe, RecipeProfile.from_units(compiled, report.targets, capacity)
    )


def preflight_recipe(step: BuildDescription, layout: Layout, runner: Runner) -> RecipePreflight:
    """Lay out the source (fetched and checked, patched), then hand the rest to ``runner``."""
    logger = recipe_logger(step.name)
    log_file = log_path(layout, step.name)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text(f"# rocwheels preflight of {step.name} {step.wheel_version}\n")
    logger.info("preflight of %s (log: %s)", step.wheel_version, log_file)
    work = fresh_dir(layout.recipe_work(step.name) / "preflight")
    started = time.monotonic()
    try:
        source = prepare_source(step.recipe, layout.recipes_dir, work / "src", log_file=log_file, logger=logger)
        patches = len(step.recipe.patches)
        source_step = Step(
            name="source",
            status="done",
            seconds=time.monotonic() - started,
            detail=f"{step.recipe.source.url or step.recipe.source.git or step.recipe.source.path}"
            + (f", {patches} patch(es) applied" if patches else ""),
        )
    except RocwheelsError as exc:
        failed = Step(name="source", status="failed", seconds=time.monotonic() - started, detail=exc.message)
        return _report(step, (failed, Step(name=COMPILES, status="not run")))
    try:
        report = runner(step, source, work, log_file).with_steps_before([source_step])
    except RocwheelsError as exc:  # before the build environment: the builder image, a build wheel's download
        failed = Step(name="build requirements", status="failed", detail=exc.message.splitlines()[0])
        return _report(step, (source_step, failed, Step(name=COMPILES, status="not run")))
    built = {dependency for dependency, _ in _built_dependencies(step, layout)}
    missing = [f"{name}=={version}" for name, version in step.dependencies if (name, version) not in built]
    if not missing:
        return report
    # A preflight runs before the builds (CI's first stage): the recipes it depends on are not built yet.
    note = (
        f"built without {', '.join(missing)} (not in the wheelhouse yet): "
        "units that include its headers cannot compile in this preflight"
    )
    return report.model_copy(update={"note": "; ".join(filter(None, (report.note, note)))})


def _built_dependencies(step: BuildDescription, layout: Layout) -> list[tuple[tuple[str, str], list[Path]]]:
    """The depends_on builds the wheelhouse holds, with their wheels."""
    found = [(dependency, find_wheels(layout.wheelhouse, *dependency)) for dependency in step.dependencies]
    return [(dependency, wheels) for dependency, wheels in found if wheels]


def _report(step: BuildDescription, steps: tuple[Step, ...]) -> RecipePreflight:
    """The report of a preflight that stopped before its job ran."""
    targets = tuple(t.processor for t in step.targets)
    return RecipePreflight(
        recipe=step.name, version=step.wheel_version, line=step.line_name, targets=targets, steps=steps
    )


def _local_runner(layout: Layout, unit_time_limit: float | None) -> Runner:
    def preflight_here(step: BuildDescription, source: Path, work: Path, log_file: Path) -> RecipePreflight:
        logger = recipe_logger(step.name)
        built = [dependency for dependency, _ in _built_dependencies(step, layout)]
        installs = installs_for(
            step,
            constraints=str(step.constraints) if step.constraints else None,
            build_wheels=[str(path) for path in fetch_build_wheels(step.recipe, layout.recipes_dir, logger)],
            find_links=[str(layout.wheelhouse)] if built else [],
            dependencies=built,
        )
        job = job_for(step, python=sys.executable, installs=installs, unit_time_limit=unit_time_limit)
        return preflight_source(job, source, work, log_file=log_file, logger=logger)

    return preflight_here


def _container_runner(plan: Plan, layout: Layout, unit_time_limit: float | None, engine: Engine | None) -> Runner:
    """In the line's builder image: the work folder mounted at /project, the job staged in it,
    ``rocwheels preflight-job`` (the image's own rocwheels) writing the report there."""
    require_pinned(plan.line_name, plan.line, layout.recipes_dir)
    engine = engine or detect_engine()
    image: str | None = None

    def preflight_in_image(step: BuildDescription, source: Path, work: Path, log_file: Path) -> RecipePreflight:
        nonlocal image
        logger = recipe_logger(step.name)
        if image is None:
            image = builder_image(plan.line_name, plan.line, engine, recipes_dir=layout.recipes_dir, log_file=log_file)
        helpers = work / HELPERS
        inside = f"{CONTAINER_PROJECT}/{HELPERS}"
        constraints, build_wheels, built = _stage(step, layout, helpers, inside)
        tag = python_tag(step.python[0])
        job = job_for(
            step,
            python=f"/opt/python/{tag}-{tag}/bin/python",  # the image's layout (docker/builder/provision.sh)
            installs=installs_for(
                step,
                constraints=constraints,
                build_wheels=build_wheels,
                find_links=[
                    *([f"{inside}/deps"] if built else []),
                    *([BUILDER_ROCM_WHEELS] if plan.line.rocm_wheels else []),
                ],
                dependencies=built,
            ),
            unit_time_limit=unit_time_limit,
            where=container_capacity(HostCapacity.measure()).where,
        )
        (helpers / JOB).write_text(job.model_dump_json(indent=2) + "\n", encoding="utf-8")
        package = f"{CONTAINER_PROJECT}/{source.relative_to(work).as_posix()}"
        # --init: the preflight's signal handling (its unit compiles stopped on Ctrl-C) needs a PID 1 that forwards.
        run(
            engine.command(
                "run",
                "--rm",
                "--init",
                "--volume",
                f"{work}:{CONTAINER_PROJECT}",
                "--workdir",
                CONTAINER_PROJECT,
                # The limit the builds will get: the units are measured and the jobs sized within it.
                *([f"--memory={memory}"] if (memory := os.environ.get(CONTAINER_MEMORY, "").strip()) else []),
                image,
                "rocwheels",
                "preflight-job",
                f"{inside}/{JOB}",
                "--source",
                package,
                "--report",
                f"{inside}/{REPORT}",
                "--log",
                f"{inside}/{LOG}",
            ),
            env=engine.env,
            log_file=log_file,
            logger=logger,
            check=False,
        )
        inner_log = helpers / LOG
        if inner_log.is_file():
            with log_file.open("a", encoding="utf-8") as sink:
                sink.write(inner_log.read_text(encoding="utf-8", errors="replace"))
        return RecipePreflight.read(helpers / REPORT)

    return preflight_in_image


def _stage(
    step: BuildDescription, layout: Layout, helpers: Path, inside: str
) -> tuple[str | None, list[str], list[tuple[str, str]]]:
    """The constraints, the depends_on wheels built so far and the build wheels in ``helpers``:
    (constraints and build wheels as the container sees them, the dependencies staged)."""
    (helpers / "deps").mkdir(parents=True)
    constraints = None
    if step.constraints:
        shutil.copy2(step.constraints, helpers / "build-constraints.txt")
        constraints = f"{inside}/build-constraints.txt"
    built = _built_dependencies(step, layout)
    for _, wheels in built:
        for wheel in wheels:
            shutil.copy2(wheel, helpers / "deps")
    (helpers / "build-wheels").mkdir()
    build_wheels = []
    for wheel in fetch_build_wheels(step.recipe, layout.recipes_dir, recipe_logger(step.name)):
        shutil.copy2(wheel, helpers / "build-wheels")
        build_wheels.append(f"{inside}/build-wheels/{wheel.name}")
    return constraints, build_wheels, [dependency for dependency, _ in built]


def run_job(job_file: Path, source: Path, report: Path, log_file: Path) -> RecipePreflight:
    """``rocwheels preflight-job``: a staged job run here (in the builder image), its report written."""
    job = PreflightJob.model_validate_json(job_file.read_text(encoding="utf-8"))
    log_file.write_text(f"# preflight of {job.recipe} {job.version} in the builder image\n")
    result = preflight_source(
        job, source, job_file.parent / "preflight", log_file=log_file, logger=recipe_logger(job.recipe)
    )
    result.write(report)
    return result
