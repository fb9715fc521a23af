"""What a recipe's preflight found: its steps, each sample unit measured, the projected full build.

Kept as JSON beside the recipe's logs (the container writes it, the host reads it) and shown as a
table like the ``wheels`` summary.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from pipeline.config.models import Model
from pipeline.errors import RocwheelsError

NOT_DESCRIBED = (
    "this recipe does not say how its units are compiled (no [preflight] table): preflighted up to its compilation"
)
REST = "rest"  # the group of units no sample group's glob takes

StepStatus = Literal["done", "failed", "not run"]
UnitStatus = Literal["compiled", "failed", "stopped", "no code object"]


class Step(Model):
    """One step of what a build does before it compiles (fetch and check the source, generate ...)."""

    name: str
    status: StepStatus
    seconds: float = 0.0
    detail: str = ""


class UnitResult(Model):
    """One sample unit compiled for one target, measured alone (what a build profile is made from)."""

    unit: str  # relative to the source folder
    group: str
    target: str
    status: UnitStatus
    seconds: float
    peak_rss_bytes: int
    command: str  # as a shell would take it
    detail: str = ""  # the first compiler error, or where the time limit stopped it
    code_objects: tuple[str, ...] = ()  # GPU processors of the object's code objects, read as verify reads them

    @property
    def ok(self) -> bool:
        return self.status == "compiled"


class Group(Model):
    """A sample group of the recipe and how many units of the full build it stands for."""

    name: str
    units: int
    sampled: tuple[str, ...] = ()  # the units compiled for it, per target
    cheapest: bool = False  # its sample is its cheapest units: its projected time is a lower bound


class Projection(Model):
    """The full build at ``jobs`` parallel compiles, from the sample's times and peaks."""

    jobs: int
    units: int  # translation units of the full build
    seconds: float
    peak_rss_bytes: int
    lower_bound: bool  # a group's sample did not compile, or was its cheapest: the full build takes at least this
    notes: tuple[str, ...] = ()


class Capacity(Model):
    """What the place the units compiled in offers a build (pipeline.build.jobs.HostCapacity)."""

    memory_bytes: int
    cores: int
    where: str


class Sizing(Model):
    """The compile jobs the measured peak memory allows where the units compiled: the build profile's figure."""

    capacity: Capacity
    jobs: int
    note: str = ""  # why fewer than the cores


class CacheCheck(Model):
    """The sample compiled twice through the build's compiler cache (pipeline.build.cache_pass)."""

    tool: str
    compiles: int
    hit_rate: float  # of the second pass
    note: str  # the rate, and each compile the cache did not serve with the cache's reason


class RecipePreflight(Model):
    """One recipe's preflight."""

    recipe: str
    version: str
    line: str
    targets: tuple[str, ...]  # compiled for
    steps: tuple[Step, ...] = ()
    groups: tuple[Group, ...] = ()
    units: tuple[UnitResult, ...] = ()
    projection: Projection | None = None
    sizing: Sizing | None = None
    cache: CacheCheck | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        """Every step done and every sample unit compiled with its code objects."""
        return all(step.status != "failed" for step in self.steps) and all(unit.ok for unit in self.units)

    def with_steps_before(self, steps: Sequence[Step]) -> RecipePreflight:
        """This report after the steps the driver did first (the source, on the host)."""
        return self.model_copy(update={"steps": (*steps, *self.steps)})

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def read(cls, path: Path) -> RecipePreflight:
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValidationError) as exc:
            raise RocwheelsError(
                f"{path}: no readable preflight report ({str(exc).splitlines()[0]})",
                fix="see the recipe's preflight log beside it; the preflight in the builder image stopped early",
            ) from None


def project(groups: Sequence[Group], units: Sequence[UnitResult], jobs: int) -> Projection | None:
    """The full build's time and peak memory at ``jobs``: each group's units at the mean time of its
    sample (summed over the targets, as the build compiles every target), spread over the jobs; each
    job at the largest peak measured. None when nothing was measured."""
    measured = [unit for unit in units if unit.ok or unit.status == "stopped"]
    if not measured:
        return None
    total_units = sum(group.units for group in groups)
    lower_bound = False
    notes: list[str] = []
    per_unit: dict[str, float] = {}  # seconds of one unit of the group, every target
    for group in groups:
        sample = [unit for unit in units if unit.group == group.name]
        if not sample:
            continue
        targets = sorted({unit.target for unit in sample})
        per_unit[group.name] = sum(_mean(u.seconds for u in sample if u.target == t) for t in targets)
        if not all(unit.ok for unit in sample):
            lower_bound = True
            notes.append(f"{group.name}: not every sample unit compiled; its units count at the time they ran")
        elif group.cheapest:
            lower_bound = True
            notes.append(f"{group.name}: projected from its cheapest units, so the full build takes longer")
    unsampled = [group for group in groups if group.name not in per_unit and group.units]
    if unsampled and per_unit:
        mean = _mean(per_unit.values())
        for group in unsampled:
            per_unit[group.name] = mean
            notes.append(f"{group.name}: {group.units} units not sampled, projected at the sampled groups' mean")
    work = sum(group.units * per_unit.get(group.name, 0.0) for group in groups)
    parallel = max(1, min(jobs, total_units))
    return Projection(
        jobs=jobs,
        units=total_units,
        seconds=max(work / parallel, max(per_unit.values(), default=0.0)),
        peak_rss_bytes=min(jobs, max(total_units, 1)) * max(unit.peak_rss_bytes for unit in measured),
        lower_bound=lower_bound,
        notes=tuple(notes),
    )


def _mean(values: Iterable[float]) -> float:
    numbers = list(values)
    return sum(numbers) / len(numbers) if numbers else 0.0


def size(count: int) -> str:
    """``1.2 GB``: memory as people read it."""
    for unit, shift in (("GB", 30), ("MB", 20)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.1f} {unit}"
    return f"{count // 1024} KB"


def duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def status(report: RecipePreflight) -> str:
    failed = next((step for step in report.steps if step.status == "failed"), None)
    if failed:
        return f"failed: {failed.name}"
    if not report.ok:
        return "failed: units"
    return "ok"


def render(reports: Sequence[RecipePreflight], console: Console | None = None) -> None:
    """The per-recipe summary, then one row per unit compiled."""
    summary = Table(title="rocwheels preflight")
    for column in ("recipe", "status", "steps", "units", "peak/unit", "time/unit", "projected", "detail"):
        summary.add_column(column)
    for report in reports:
        done = [step.name for step in report.steps if step.status == "done"]
        compiled = [unit for unit in report.units if unit.ok]
        projection = report.projection
        projected = "-"
        if projection:
            bound = "≥ " if projection.lower_bound else ""
            projected = (
                f"{bound}{duration(projection.seconds)}, {size(projection.peak_rss_bytes)} "
                f"({projection.units} units, {projection.jobs} jobs)"
            )
        details = [
            *(f"{step.name}: {step.detail}" for step in report.steps if step.status == "failed"),
            *(f"{unit.unit} [{unit.target}]: {unit.detail}" for unit in report.units if not unit.ok),
            *(projection.notes if projection else ()),
            *(
                [
                    f"jobs that fit {report.sizing.capacity.where}: {report.sizing.jobs}"
                    + (f" ({report.sizing.note})" if report.sizing.note else "")
                ]
                if report.sizing
                else []
            ),
            *([f"compiler cache: {report.cache.note}"] if report.cache else []),
            *([report.note] if report.note else []),
        ]
        summary.add_row(
            report.recipe,
            status(report),
            ", ".join(done) or "-",
            f"{len(compiled)} of {len(report.units)}" + (f" ({', '.join(report.targets)})" if report.targets else ""),
            size(max(unit.peak_rss_bytes for unit in report.units)) if report.units else "-",
            duration(_mean(unit.seconds for unit in compiled)) if compiled else "-",
            projected,
            "\n".join(details),
        )
    units = Table(title="units compiled")
    for column in ("recipe", "unit", "group", "target", "status", "peak memory", "time", "code objects"):
        units.add_column(column)
    for report in reports:
        for unit in report.units:
            units.add_row(
                report.recipe,
                unit.unit,
                unit.group,
                unit.target,
                unit.status,
                size(unit.peak_rss_bytes),
                duration(unit.seconds),
                ", ".join(unit.code_objects) or "-",
            )
    # Piped output (CI logs) keeps whole unit paths and details rather than folding them at 80 columns.
    console = console or (Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=200))
    console.print(summary)
    if units.row_count:
        console.print(units)
