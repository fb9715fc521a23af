"""The whole job for a plan: build -> repair -> verify -> wheelhouse, recipe by recipe.

A wheel reaches the wheelhouse only after it was repaired and verified; it moves there with
one rename. A failed recipe leaves nothing there, and the recipes that depend on it are skipped.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .build import BuiltWheel, accepted_wheel, build_local, find_wheel
from .errors import RocwheelsError
from .layout import Layout
from .log import recipe_logger
from .plan import Plan, Step
from .progress import long_step
from .repair import repair_wheel
from .verify import format_report, verify_wheel, expectations_for

log = logging.getLogger("rocwheels")

# A build driver turns one step into a raw wheel (local host, or the builder container).
Driver = Callable[[Step, Layout, Callable[[str], None]], BuiltWheel]


@dataclass(frozen=True)
class Outcome:
    recipe: str
    status: str  # "built", "up to date", "failed", "skipped"
    wheel: Path | None = None
    seconds: float = 0.0
    detail: str = ""


def local_driver(step: Step, layout: Layout, on_output: Callable[[str], None]) -> BuiltWheel:
    return build_local(step, layout, on_output=on_output)


def make_wheels(plan: Plan, layout: Layout, driver: Driver = local_driver, *, force: bool = False) -> list[Outcome]:
    outcomes: dict[str, Outcome] = {}
    for step in plan.steps:
        failed_deps = [d for d in step.recipe.depends_on if outcomes[d].status in ("failed", "skipped")]
        if failed_deps:
            outcomes[step.name] = Outcome(step.name, "skipped", detail=f"needs {', '.join(failed_deps)}")
            continue
        existing = find_wheel(layout.wheelhouse, step.recipe.dist_name, step.wheel_version)
        if existing and not force:
            outcomes[step.name] = Outcome(step.name, "up to date", existing, detail="already in the wheelhouse (--force rebuilds)")
            continue
        started = time.monotonic()
        try:
            wheel = _one_recipe(plan, step, layout, driver)
            outcomes[step.name] = Outcome(step.name, "built", wheel, time.monotonic() - started)
        except RocwheelsError as exc:
            recipe_logger(step.name).error("failed: %s", exc)
            outcomes[step.name] = Outcome(step.name, "failed", None, time.monotonic() - started, exc.message.splitlines()[0])
    return list(outcomes.values())


def _one_recipe(plan: Plan, step: Step, layout: Layout, driver: Driver) -> Path:
    logger = recipe_logger(step.name)
    log_file = layout.log_file(step.name)
    with long_step(f"{step.name}: build", logger) as on_output:
        built = driver(step, layout, on_output)
    recipe = step.recipe
    if built.repaired:
        repaired = built.path
    else:
        staging = layout.staging(step.name)
        if staging.exists():
            shutil.rmtree(staging)
        logger.info("repairing %s", built.path.name)
        repaired = repair_wheel(
            built.path, staging, extra_excludes=recipe.repair.exclude, rocm_lib_dir=plan.line.lib_dir,
            link_packages=recipe.repair.link_packages, extra_rpath=recipe.repair.rpath, plat=plan.line.platform,
            log_file=log_file, logger=logger,
        )
    logger.info("verifying %s", repaired.name)
    deps = tuple(accepted_wheel(layout.wheelhouse, name, version) for name, version in step.dependencies)
    expect = expectations_for(recipe, plan.line, tuple(t.processor for t in plan.targets), version=step.wheel_version, smoke_wheels=deps)
    report = verify_wheel(repaired, expect, log_file=log_file, scratch=layout.work_dir)
    for line in format_report(report).splitlines():
        logger.info("%s", line)
    if not report.ok:
        raise RocwheelsError(f"{repaired.name} failed verification: " + "; ".join(f.message for f in report.errors()),
                             fix=f"see {log_file}; the wheel was not put in the wheelhouse")
    return _accept(repaired, layout.wheelhouse)


def _accept(wheel: Path, wheelhouse: Path) -> Path:
    """Move a verified wheel into the wheelhouse with one rename (copy next to it first if needed)."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    final = wheelhouse / wheel.name
    partial = wheelhouse / f".{wheel.name}.partial"
    try:
        os.replace(wheel, final)
    except OSError:  # another file system: copy beside the target, then rename
        shutil.copyfile(wheel, partial)
        os.replace(partial, final)
        wheel.unlink()
    return final


def summary_table(outcomes: list[Outcome], console: Console | None = None) -> None:
    table = Table(title="rocwheels")
    for column in ("recipe", "status", "wheel", "time", "detail"):
        table.add_column(column)
    for o in outcomes:
        table.add_row(o.recipe, o.status, o.wheel.name if o.wheel else "-", f"{o.seconds:.0f} s" if o.seconds else "-", o.detail)
    (console or Console(stderr=True)).print(table)
