"""The AMD GPU processors rocwheels knows, read once from ``pipeline/data/gfx-targets.toml``: the
one table of names, ELF ``EF_AMDGPU_MACH`` values and generic targets that ARCH checking, the lock
and recipe validators, verify and the ELF reader all use.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from pipeline.errors import ConfigError

log = logging.getLogger("rocwheels")

TABLE_FILE = "pipeline/data/gfx-targets.toml"  # as the package holds it, for messages


@dataclass(frozen=True)
class GpuProcessor:
    """A processor (``gfx942``) or a generic target (``gfx9-4-generic``)."""

    name: str
    mach: int  # EF_AMDGPU_MACH: the low byte of the e_flags of the code objects compiled for it
    family: str  # hardware generation; "" for a generic target
    generic: str | None  # the generic target whose code objects this processor also loads
    serves: tuple[str, ...]  # for a generic target: the processors naming it; () for a processor
    unverified: str | None  # why the values are not checked against the table's cited source


@dataclass(frozen=True)
class ProcessorTable:
    by_name: Mapping[str, GpuProcessor]  # processors first, then generic targets, in the file's order
    by_mach: Mapping[int, GpuProcessor]

    def describe(self, name: str) -> str:
        """What hardware ``name`` is: its family, or the processors a generic target serves."""
        entry = self.by_name[name]
        if entry.serves or not entry.family:
            return "generic target for " + (", ".join(entry.serves) or "no processor in the table")
        return entry.family


@cache
def gpu_processors() -> ProcessorTable:
    """The table of ``data/gfx-targets.toml``, read once per process."""
    return processor_table(tomllib.loads(resources.files("pipeline").joinpath("data/gfx-targets.toml").read_text()))


def processor_table(document: Mapping[str, Any]) -> ProcessorTable:
    """The table a parsed ``gfx-targets.toml`` holds, checked (unique names and values, known
    generic targets)."""
    processors = document.get("processors", {})
    generics = document.get("generic", {})
    serves: dict[str, list[str]] = {name: [] for name in generics}
    for name, fields in processors.items():
        generic = fields.get("generic")
        if generic is not None and generic not in serves:
            raise ConfigError(
                TABLE_FILE,
                f"processors.{name}.generic",
                f"{generic!r} is not a generic target of the table",
                fix=f"add it under [generic] or name one of: {', '.join(generics)}",
            )
        if generic is not None:
            serves[generic].append(name)
    entries = [_entry(name, fields, "processors", ()) for name, fields in processors.items()]
    entries += [_entry(name, fields, "generic", tuple(serves[name])) for name, fields in generics.items()]
    by_name: dict[str, GpuProcessor] = {}
    by_mach: dict[int, GpuProcessor] = {}
    for entry in entries:
        if entry.name in by_name:
            raise ConfigError(TABLE_FILE, entry.name, "is both a processor and a generic target", fix="keep one")
        if entry.mach in by_mach:
            raise ConfigError(
                TABLE_FILE,
                entry.name,
                f"mach 0x{entry.mach:03X} is also {by_mach[entry.mach].name}'s",
                fix="check both values against the source the file cites",
            )
        by_name[entry.name] = by_mach[entry.mach] = entry
    return ProcessorTable(MappingProxyType(by_name), MappingProxyType(by_mach))


def _entry(name: str, fields: Any, section: str, serves: tuple[str, ...]) -> GpuProcessor:
    mach = fields.get("mach") if isinstance(fields, dict) else None
    if not isinstance(mach, int) or not 0 < mach <= 0xFF:
        raise ConfigError(
            TABLE_FILE,
            f"{section}.{name}.mach",
            f"{mach!r} is not an EF_AMDGPU_MACH value",
            fix="give the value (0x001-0x0FF) the cited source defines",
        )
    return GpuProcessor(
        name=name,
        mach=mach,
        family=fields.get("family", ""),
        generic=fields.get("generic"),
        serves=serves,
        unverified=fields.get("unverified"),
    )


@cache
def warn_if_unverified(name: str) -> None:
    """Warn once per process when a processor whose table values are unverified is used (ARCH, a code object)."""
    entry = gpu_processors().by_name.get(name)
    if entry is not None and entry.unverified:
        log.warning("warning: %s: %s is unverified (%s)", TABLE_FILE, name, entry.unverified)
