"""Wheel files given on the command line: repair, verify or inspect each with the description the project gives it.

``rocwheels wheels`` hands every stage the description it resolved; a wheel named on its own gets
one from :func:`~pipeline.description.describe_wheel` (its provenance record, or the lock by its
label), or the defaults of :func:`~pipeline.description.unknown_wheel` where the project cannot
tell what it is. Options the user gives are added on top.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pipeline.config.layout import Layout
from pipeline.config.lock import trusted_keys
from pipeline.config.targets import GpuTarget
from pipeline.config.toolchain import rocm_lib_dir as default_rocm_lib_dir
from pipeline.description import describe_wheel, unknown_wheel
from pipeline.repair.repair import RepairSettings, repair_wheel
from pipeline.util.runlock import wheelhouse_lock
from pipeline.verify.verify import Expectations, Report, verify_wheel
from pipeline.wheel.analyze import WheelAnalysis


@dataclass(frozen=True)
class RepairOptions:
    """What ``rocwheels repair`` adds to a wheel's own settings (or replaces them with: ``settings_file``)."""

    settings_file: Path | None = None
    rocm: str | None = None
    rocm_lib_dir: str | None = None
    excludes: tuple[str, ...] = ()
    link_packages: tuple[str, ...] = ()
    extra_rpath: tuple[str, ...] = ()
    plat: str | None = None
    requires_pins: tuple[str, ...] = ()
    rocm_wheels: bool = False  # --rocm-provider wheels


def repair_files(layout: Layout, wheels: Sequence[Path], output: Path, options: RepairOptions) -> Iterator[Path]:
    """Repair each wheel into ``output``; yields each repaired wheel's path as it is written."""
    given = RepairSettings.read(options.settings_file) if options.settings_file else None
    with wheelhouse_lock(output):
        for wheel in wheels:
            if given is None:
                description = describe_wheel(layout, wheel, options.rocm, None)
                base = description.repair if description else unknown_wheel(None)[0]
            else:
                base = given
            settings = base.extended(
                excludes=options.excludes,
                link_packages=options.link_packages,
                extra_rpath=options.extra_rpath,
                requires_pins=options.requires_pins,
                rocm_lib_dir=options.rocm_lib_dir,
                plat=options.plat,
            )
            yield repair_wheel(wheel, output, settings.with_rocm_wheels() if options.rocm_wheels else settings)


def verify_files(
    layout: Layout,
    wheels: Sequence[Path],
    *,
    targets: tuple[GpuTarget, ...] | None,
    rocm: str | None,
    rocm_lib_dir: str | None,
    smoke: bool,
) -> list[Report]:
    """Verify each wheel against its description; ``targets`` None leaves the targets unjudged unless recorded."""
    # The smoke test's venv is made in the work folder, which a fresh clone does not have yet.
    layout.work_dir.mkdir(parents=True, exist_ok=True)
    trusted = trusted_keys(layout.recipes_dir)
    reports = []
    for wheel in wheels:
        expect = wheel_expectations(layout, wheel, targets=targets, rocm=rocm)
        if rocm_lib_dir:
            expect = replace(expect, layout=replace(expect.layout, rocm_lib_dir=rocm_lib_dir))
        reports.append(verify_wheel(wheel, expect, smoke=smoke, scratch=layout.work_dir, trusted_keys=trusted))
    return reports


def wheel_expectations(
    layout: Layout, wheel: Path, *, targets: tuple[GpuTarget, ...] | None = None, rocm: str | None = None
) -> Expectations:
    """What verify checks in a wheel found on its own: its description's expectations, else the defaults."""
    description = describe_wheel(layout, wheel, rocm, targets)
    if description is None:
        return unknown_wheel(targets)[1]
    # The exact builds it is pinned to are looked for beside it (the wheelhouse).
    return replace(description.expect, find_links=wheel.parent if description.dependencies else None)


def inspect_files(layout: Layout, wheels: Sequence[Path], rocm_lib_dir: str | None) -> Iterator[WheelAnalysis]:
    """Each wheel analysed where its line expects ROCm; a wheel the project cannot tell is read
    against both providers (a ROCm folder, the ROCm packages), whichever its RPATHs reach."""
    from pipeline.verify.inspect_table import either_provider, inspect_wheel

    for wheel in wheels:
        description = describe_wheel(layout, wheel, None, None)
        if description is None:
            target_layout = either_provider(rocm_lib_dir or default_rocm_lib_dir())
        else:
            target_layout = description.repair.target_layout()
            if rocm_lib_dir:
                target_layout = replace(target_layout, rocm_lib_dir=rocm_lib_dir)
        yield inspect_wheel(wheel, target_layout)
