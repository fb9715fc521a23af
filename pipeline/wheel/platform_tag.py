"""Which platform tag a wheel's contents allow: the symbol-version analysis of auditwheel's
policies (the glibc, libstdc++, libgcc ... versions each manylinux/musllinux policy offers).

verify asks of every wheel (repair runs auditwheel's whole analysis in ``AnalysisAside.submit``): a
``manylinux_2_X`` tag is a promise that the wheel runs on any distribution with glibc 2.X, and
only the contents can keep it. The versions come from each ELF file's DT_VERNEED
(``.gnu.version_r``), read while that analysis has the file on disk anyway: auditwheel's whole-wheel
analysis unpacks the wheel again and walks every symbol table (158 s on a 192 MB torch wheel here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from auditwheel.architecture import Architecture
from auditwheel.elfutils import elf_find_versioned_symbols
from auditwheel.libc import Libc
from auditwheel.policy import WheelPolicies
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from pipeline.wheel.elf import ElfError

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
    except ELFError as exc:  # read_elf, which reads the same section first, names the damage
        raise ElfError(f"{path}: section .gnu.version_r does not parse: {exc}") from None


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
        return AllowedPlatform(
            tag, f"{tag} is no platform tag auditwheel knows ({', '.join(p.name for p in policies)})"
        )
    needed: dict[str, set[str]] = {}
    for library, version in versions:
        needed.setdefault(library, set()).add(version)
    best = policies.versioned_symbols_policy(needed)
    if wanted.priority <= best.priority:  # higher priority: runs on more (older) systems
        return AllowedPlatform(best.name, None)
    too_new = sorted(
        f"{library} {version}"
        for library, names in needed.items()
        for version in names
        if _beyond(version, wanted.symbol_versions)
    )
    return AllowedPlatform(
        best.name,
        f"its contents do not allow {tag}: they need {', '.join(too_new)}; the most they allow is {best.name}",
    )


def _beyond(version: str, offered: Mapping[str, frozenset[str]]) -> bool:
    family, _, number = version.partition("_")
    return family in offered and number not in offered[family]
