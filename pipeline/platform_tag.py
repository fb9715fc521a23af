"""Which platform tag a wheel's contents allow: the symbol-version analysis of auditwheel's
policies (the glibc, libstdc++, libgcc ... versions each manylinux/musllinux policy offers).

repair asks before it writes a tag, verify asks of every wheel: a ``manylinux_2_X`` tag is a
promise that the wheel runs on any distribution with glibc 2.X, and only the contents can keep it.
The versions come from each ELF file's DT_VERNEED (``.gnu.version_r``), a few hundred bytes:
auditwheel's whole-wheel analysis also walks every symbol table, minutes on a torch wheel.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from auditwheel.architecture import Architecture
from auditwheel.elfutils import elf_find_versioned_symbols
from auditwheel.libc import Libc
from auditwheel.policy import WheelPolicies
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from .elf import ELF_MAGIC
from .errors import RocwheelsError
from .wheelfile import extract, open_wheel

# (needed library, version) pairs, e.g. ("libc.so.6", "GLIBC_2.34")
SymbolVersions = Iterable[tuple[str, str]]


@dataclass(frozen=True)
class AllowedPlatform:
    best: str  # the most compatible tag the contents allow (linux_<arch> when no manylinux one is)
    problem: str | None  # why the tag asked about is not allowed; None when it is


def symbol_versions(path: Path) -> tuple[tuple[str, str], ...]:
    """The versioned symbols ELF file ``path`` needs from other libraries (auditwheel's reader)."""
    try:
        with path.open("rb") as stream:
            return tuple(elf_find_versioned_symbols(ELFFile(stream)))
    except ELFError:
        return ()  # not a file the loader would map either; the ELF checks report it


def wheel_symbol_versions(wheel: Path) -> tuple[tuple[str, str], ...]:
    """The versioned symbols every ELF file of ``wheel`` needs (one file on disk at a time)."""
    found: list[tuple[str, str]] = []
    with open_wheel(wheel) as archive, tempfile.TemporaryDirectory(prefix="rocwheels-tag-") as scratch:
        for info in archive.infolist():
            if info.is_dir() or info.file_size < len(ELF_MAGIC):
                continue
            with archive.open(info) as stream:
                if stream.read(len(ELF_MAGIC)) != ELF_MAGIC:
                    continue
            path = extract(archive, [info.filename], Path(scratch))[info.filename]
            found.extend(symbol_versions(path))
            path.unlink()
    return tuple(found)


def check_platform_tag(versions: SymbolVersions, tag: str) -> AllowedPlatform:
    """Whether a wheel needing ``versions`` may carry the manylinux/musllinux ``tag``."""
    arch = next((a for a in Architecture if tag.endswith(f"_{a.value}")), None)
    if arch is None or not tag.startswith(("manylinux", "musllinux")):
        return AllowedPlatform(tag, f"{tag} is not a manylinux or musllinux tag")
    if tag.startswith("musllinux"):
        policies = WheelPolicies(libc=Libc.MUSL, arch=arch, musl_policy=tag.removesuffix(f"_{arch.value}"))
    else:
        policies = WheelPolicies(libc=Libc.GLIBC, arch=arch)
    try:
        wanted = policies.get_policy_by_name(tag)
    except (LookupError, ValueError):
        return AllowedPlatform(tag, f"{tag} is no platform tag auditwheel knows ({', '.join(p.name for p in policies)})")
    needed: dict[str, set[str]] = {}
    for library, version in versions:
        needed.setdefault(library, set()).add(version)
    best = policies.versioned_symbols_policy(needed)
    if wanted.priority <= best.priority:  # higher priority: runs on more (older) systems
        return AllowedPlatform(best.name, None)
    too_new = sorted(f"{library} {version}" for library, names in needed.items() for version in names
                     if _beyond(version, wanted.symbol_versions))
    return AllowedPlatform(best.name, f"its contents do not allow {tag}: they need {', '.join(too_new)}; "
                                      f"the most they allow is {best.name}")


def _beyond(version: str, offered: Mapping[str, frozenset[str]]) -> bool:
    family, _, number = version.partition("_")
    return family in offered and number not in offered[family]


def require_platform_tag(wheel: Path, tag: str) -> None:
    """Stop before ``tag`` is written on a wheel whose contents do not allow it."""
    allowed = check_platform_tag(wheel_symbol_versions(wheel), tag)
    if allowed.problem:
        raise RocwheelsError(
            f"cannot tag {wheel.name} {tag}: {allowed.problem}",
            fix="build in an older builder image (a manylinux one), or stop using the newer symbols; "
                "a wheel only linux_* allows cannot be shared as manylinux",
        )
