"""The whole job for a plan: build -> repair -> verify -> wheelhouse, recipe by recipe.

A wheel reaches the wheelhouse only after it was repaired and verified, together with its
provenance record: a recipe's wheels and records are renamed into place with signals held. A
failed recipe leaves nothing there, and the recipes that depend on it are skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pipeline.build.diagnose import first_error_in
from pipeline.build.host import host_rocm_version
from pipeline.build.local import BuiltWheel, build_local, find_wheels
from pipeline.build.sources import fetch_build_wheels
from pipeline.config.layout import Layout, fresh_dir
from pipeline.description import BuildDescription
from pipeline.errors import CommandError, RocwheelsError
from pipeline.plan import Plan
from pipeline.repair.pins import pin_wheel
from pipeline.repair.repair import repair_wheel
from pipeline.util.files import partial_path
from pipeline.util.interrupts import held_while
from pipeline.util.log import recipe_logger
from pipeline.util.progress import long_step
from pipeline.verify.provenance import fingerprints, is_current, record_path, write_record
from pipeline.verify.signing import signing_key
from pipeline.verify.verify import format_report, variant_findings, verify_wheel
from pipeline.wheel.archive import parse_wheel_name
from pipeline.wheel.variant import make_variant
from pipeline.wheel.zipwrite import move_file

# A build driver turns one step into a raw wheel (local host, or the builder container).
Driver = Callable[[BuildDescription, Layout, Callable[[str], None]], BuiltWheel]


@dataclass(frozen=True)
class Outcome:
    recipe: str
    status: str  # "built", "up to date", "failed", "skipped"
    wheels: tuple[Path, ...] = ()  # in the wheelhouse, one per Python version
    seconds: float = 0.0
    detail: str = ""


def local_driver(step: BuildDescription, layout: Layout, on_output: Callable[[str], None]) -> BuiltWheel:
    return build_local(step, layout, on_output=on_output)


def make_wheels(plan: Plan, layout: Layout, driver: Driver = local_driver, *, force: bool = False) -> list[Outcome]:
    """Build what is not up to date: a recipe whose wheels' provenance matches its fingerprint
    is skipped; any change to its inputs (or its dependencies') rebuilds it."""
    outcomes: dict[str, Outcome] = {}
    prints = fingerprints(plan, layout.recipes_dir)
    signer = signing_key(layout.recipes_dir)
    for step in plan.steps:
        failed_deps = [d for d in step.recipe.depends_on if outcomes[d].status in ("failed", "skipped")]
        if failed_deps:
            outcomes[step.name] = Outcome(step.name, "skipped", detail=f"needs {', '.join(failed_deps)}")
            continue
        fingerprint, inputs = prints[step.name]
        existing = published_files(layout.wheelhouse, step)
        if existing and not force and all(is_current(wheel, fingerprint) for wheel in existing):
            outcomes[step.name] = Outcome(
                step.name,
                "up to date",
                tuple(existing),
                detail=f"same inputs (fingerprint {fingerprint[:12]}; --force rebuilds)",
            )
            continue
        if existing and not force:
            recipe_logger(step.name).info(
                "inputs changed since %s was built: rebuilding", ", ".join(w.name for w in existing)
            )
        started = time.monotonic()
        try:
            verified, note = _one_recipe(plan, step, layout, driver)
            for wheel in verified:
                write_record(wheel, fingerprint, inputs, _toolchain(plan), signer)
            wheels = _accept(verified, layout.wheelhouse, step)
            outcomes[step.name] = Outcome(step.name, "built", wheels, time.monotonic() - started, note)
        except RocwheelsError as exc:
            recipe_logger(step.name).error("failed: %s", exc)
            outcomes[step.name] = Outcome(
                step.name, "failed", (), time.monotonic() - started, _cause(exc, layout, step)
            )
    return list(outcomes.values())


def _one_recipe(plan: Plan, step: BuildDescription, layout: Layout, driver: Driver) -> tuple[tuple[Path, ...], str]:
    """Build, repair and verify every wheel of one recipe: all of them, still outside the wheelhouse, or an error."""
    logger = recipe_logger(step.name)
    log_file = layout.log_file(step.name)
    with long_step(f"{step.name}: build", logger) as on_output:
        built = driver(step, layout, on_output)
    recipe = step.recipe
    staging = fresh_dir(layout.staging(step.name))
    repaired = []
    for wheel in built.paths:
        if built.repaired:  # in the builder image, from the same description
            repaired.append(wheel)
            continue
        if all(tag.platform == "any" for tag in parse_wheel_name(wheel.name)[3]):
            # No compiled code to repair (flash-attention's Triton backend): only the pins to write.
            pins = step.repair.requires_pins
            repaired.append(pin_wheel(wheel, staging, pins) if pins else wheel)
            continue
        logger.info("repairing %s", wheel.name)
        repaired.append(repair_wheel(wheel, staging, step.repair, log_file=log_file, logger=logger))
    # The smoke test installs the exact builds next to the wheel: the line's from the wheelhouse, build wheels from their files.
    build_wheels = tuple(map(str, fetch_build_wheels(recipe, layout.recipes_dir, logger)))
    expect = replace(
        step.expect,
        smoke_requirements=(*step.expect.smoke_requirements, *build_wheels),
        find_links=layout.wheelhouse if step.dependencies else None,
    )
    published: list[Path] = []
    for wheel in repaired:
        logger.info("verifying %s", wheel.name)
        report = verify_wheel(wheel, expect, log_file=log_file, scratch=layout.work_dir)
        # A wheel without GPU code objects is the same for every target set: it is its plain wheel only.
        variant = step.variant if report.gpu_targets else None
        if variant is not None:
            # The variant is the verified bytes plus variant.json: only that file is checked again.
            variant_wheel = make_variant(wheel, staging / "variants", variant)
            findings = variant_findings(variant_wheel, report.gpu_targets)
            report = replace(report, findings=(*report.findings, *findings))
            published.append(variant_wheel)
        if variant is None or variant.plain:
            published.append(wheel)
        for line in format_report(report).splitlines():
            logger.info("%s", line)
        if not report.ok:
            raise RocwheelsError(
                f"{wheel.name} failed verification: " + "; ".join(f.message for f in report.errors()),
                fix=f"see {log_file}; no wheel of {step.name} was put in the wheelhouse",
            )
    return tuple(published), built.note


def _cause(exc: RocwheelsError, layout: Layout, step: BuildDescription) -> str:
    """The summary's one line: a failed command's first compiler error (from the recipe's log), else the message's first line."""
    if isinstance(exc, CommandError):
        found = first_error_in(layout.log_file(step.name))
        if found:
            return f"{found} (log: {layout.log_file(step.name)})"
    return exc.message.splitlines()[0]


def published_files(wheelhouse: Path, step: BuildDescription) -> list[Path]:
    """The wheelhouse files a build of ``step`` makes: the variant wheels of its GPU targets, and the
    plain wheels when it is the line's plain build (or carries no GPU code). Builds for other target
    sets own other files: a rebuild for gfx942 never removes the gfx90a variant."""
    dist, version, variant = step.recipe.dist_name, step.wheel_version, step.variant
    if variant is None:
        return find_wheels(wheelhouse, dist, version)
    plain = find_wheels(wheelhouse, dist, version) if variant.plain else []
    return [*find_wheels(wheelhouse, dist, version, variant.label), *plain]


def _toolchain(plan: Plan) -> dict[str, str]:
    """What compiled the wheel: the builder image, or this host's HIP release."""
    if plan.driver == "container":
        return {"driver": "container", "builder_image": plan.line.builder_image}
    return {"driver": "local", "hip": host_rocm_version() or "unknown"}


def _accept(verified: tuple[Path, ...], wheelhouse: Path, step: BuildDescription) -> tuple[Path, ...]:
    """Put one recipe's verified wheels and their records into the wheelhouse, all of them or none.

    Each file is first brought beside its place under a hidden name (a copy from another file
    system takes long: it can be interrupted, and the hidden copies are removed). Then all are
    renamed into place with signals held, so no wheel lies there without its record or beside the
    files of the build it replaces; a signal that came meanwhile stops the run after."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    incoming: list[tuple[Path, Path]] = []  # (hidden, final)
    try:
        for wheel in verified:
            for source in (wheel, record_path(wheel)):
                final = wheelhouse / source.name
                incoming.append((move_file(source, partial_path(final)), final))
        accepted = tuple(wheelhouse / wheel.name for wheel in verified)
        with held_while():
            for hidden, final in incoming:
                hidden.replace(final)
            # A rebuild may carry another platform tag: older files of this version would shadow it.
            for stale in set(published_files(wheelhouse, step)) - set(accepted):
                recipe_logger(step.name).info("removing %s, replaced by this build", stale.name)
                stale.unlink()
                record_path(stale).unlink(missing_ok=True)
    finally:
        for hidden, _ in incoming:
            hidden.unlink(missing_ok=True)  # those not renamed: an error or a signal came first
    return accepted


def summary_table(outcomes: list[Outcome], console: Console | None = None) -> None:
    table = Table(title="rocwheels")
    for column in ("recipe", "status", "wheel", "time", "detail"):
        table.add_column(column)
    for o in outcomes:
        table.add_row(
            o.recipe,
            o.status,
            "\n".join(w.name for w in o.wheels) or "-",
            f"{o.seconds:.0f} s" if o.seconds else "-",
            o.detail,
        )
    (console or Console(stderr=True)).print(table)
