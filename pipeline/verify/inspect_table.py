"""``rocwheels inspect``: a readable table of a wheel's ELF files. Works on any wheel."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from pipeline.config.rocm_wheels import package_links, package_of
from pipeline.repair.policy import LinkPackage
from pipeline.wheel.analyze import ElfMember, Kind, TargetLayout, WheelAnalysis, analyze_wheel


def inspect_wheel(wheel: Path, layout: TargetLayout | None = None) -> WheelAnalysis:
    return analyze_wheel(wheel, layout)


def either_provider(rocm_lib_dir: str) -> TargetLayout:
    """ROCm from ``rocm_lib_dir`` or from the ROCm packages (TheRock), whichever a file's RPATH reaches."""
    return TargetLayout(
        rocm_lib_dir=rocm_lib_dir, link_packages=tuple(LinkPackage.parse(entry) for entry in package_links())
    )


def render(analysis: WheelAnalysis, console: Console) -> None:
    info = analysis.info
    console.print(
        f"[bold]{info.path.name}[/bold]: {info.name} {info.version}, tags {', '.join(info.tags)}, "
        f"{len(analysis.members)} ELF file(s); ROCm from {analysis.layout.rocm_lib_dir or 'pip packages only'}"
        f"{' or the ROCm packages (TheRock wheels)' if analysis.layout.rocm_lib_dir and analysis.layout.link_packages else ''}"
    )
    table = Table(show_lines=True)
    for column in ("ELF file", "bundled", "ROCm (excluded) -> from", "system", "missing", "RPATH", "GPU targets"):
        table.add_column(column, overflow="fold")
    for member in analysis.members:
        missing = "\n".join(
            f"{d.soname}: {d.note}" for d in member.dependencies if d.location is None and d.kind is Kind.MISSING
        )
        if member.fatbin_error:
            targets = f"unreadable: {member.fatbin_error}"
        elif member.amdgpu_processor:
            targets = f"{member.amdgpu_processor} (code object)"
        else:
            compression = f"\n{member.bundles} bundle(s), {'/'.join(member.compression)}" if member.bundles else ""
            targets = ", ".join(member.gpu_targets) + compression
        rocm = "\n".join(
            f"{d.soname} -> {_rocm_origin(d.location)}" if d.location else f"{d.soname} (!)"
            for d in member.dependencies
            if d.kind is Kind.ROCM
        )
        table.add_row(
            member.install_path,
            _names(member, Kind.BUNDLED),
            rocm,
            _names(member, Kind.SYSTEM, Kind.PACKAGE),
            missing,
            "\n".join(e or '""' for e in member.search_path),
            targets,
        )
    console.print(table)
    unreachable = [
        (m.install_path, d)
        for m in analysis.members
        for d in m.dependencies
        if d.location is None and d.kind is not Kind.MISSING
    ]
    for path, dep in unreachable:
        console.print(f"(!) {path}: {dep.soname}: {dep.note}")


def _rocm_origin(location: str) -> str:
    """``rocm-sdk-core (_rocm_sdk_core/lib)`` for a ROCm package's folder, else the machine's folder."""
    package = package_of(location)
    return f"{package} ({location})" if package else location


def _names(member: ElfMember, *kinds: Kind) -> str:
    """The member's needed libraries of these kinds, one a line; (!) marks one not found."""
    return "\n".join(d.soname + ("" if d.location else " (!)") for d in member.dependencies if d.kind in kinds)
