"""What the pipeline reads from ELF files: dynamic linking names and paths, HIP fat binaries, and
the GPU processor of standalone AMDGPU code objects.

pyelftools reads lazily from the open file, so only headers, the dynamic section and
``.hip_fatbin`` are read: a ROCm library can be hundreds of megabytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.construct import ConstructError
from elftools.elf.dynamic import DynamicSection, DynamicTag
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

from pipeline.config.gpu_processors import gpu_processors
from pipeline.errors import RocwheelsError

ELF_MAGIC = b"\x7fELF"
EF_AMDGPU_MACH = 0xFF  # e_flags bits naming the processor of an EM_AMDGPU (224) object


class ElfError(RocwheelsError):
    """A file that is not ELF, or an ELF file too damaged to read."""


@dataclass(frozen=True)
class ElfInfo:
    """What the pipeline needs from one ELF file."""

    machine: str  # pyelftools' name of e_machine: "EM_X86_64", "EM_AMDGPU"
    soname: str | None
    needed: tuple[str, ...]
    # Entries split on ":"; an empty entry stays "" (the loader reads it as the current directory).
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    hip_fatbin: bytes | None = field(repr=False)
    amdgpu_processor: str | None  # from e_flags, for standalone AMDGPU code objects only


def is_elf(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file that starts with the ELF magic."""
    path = Path(path)
    if not path.is_file():
        return False
    with path.open("rb") as stream:
        return stream.read(len(ELF_MAGIC)) == ELF_MAGIC


def read_elf(path: str | os.PathLike[str], *, with_fatbin: bool = True) -> ElfInfo:
    """The dynamic section entries, ``.hip_fatbin`` and GPU processor of the ELF file ``path``.

    ``with_fatbin=False`` skips reading ``.hip_fatbin`` (hundreds of MB in a ROCm library).
    """
    try:
        with open(path, "rb") as stream:
            return _read(ELFFile(stream), os.fstat(stream.fileno()).st_size, with_fatbin)
    except OSError as exc:
        raise ElfError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    # pyelftools checks some fields of damaged files with assert.
    except (ELFError, ConstructError, AssertionError, ValueError) as exc:
        raise ElfError(f"{path}: not a readable ELF file: {exc}") from exc


def amdgpu_processor(e_flags: int) -> str:
    """The processor named by the EF_AMDGPU_MACH bits of an AMDGPU code object's e_flags."""
    mach = e_flags & EF_AMDGPU_MACH
    entry = gpu_processors().by_mach.get(mach)
    return entry.name if entry else f"unknown EF_AMDGPU_MACH 0x{mach:02x}"


def _read(elf: ELFFile, file_size: int, with_fatbin: bool) -> ElfInfo:
    soname = None
    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    _check_header_tables(elf, file_size)
    for section in elf.iter_sections():
        if isinstance(section, GNUVerNeedSection | GNUVerDefSection):
            _check_versions(section, file_size)
        if not isinstance(section, DynamicSection):
            continue
        _check_dynamic(elf, section, file_size)
        for tag in section.iter_tags():
            kind = tag.entry.d_tag
            if kind == "DT_SONAME":
                soname = _tag_string(tag, "soname")
            elif kind == "DT_NEEDED":
                needed.append(_tag_string(tag, "needed"))
            elif kind == "DT_RPATH":
                rpath.extend(_tag_string(tag, "rpath").split(":"))
            elif kind == "DT_RUNPATH":
                runpath.extend(_tag_string(tag, "runpath").split(":"))
    machine = str(elf["e_machine"])  # pyelftools gives a number for machines it does not know
    return ElfInfo(
        machine=machine,
        soname=soname,
        needed=tuple(needed),
        rpath=tuple(rpath),
        runpath=tuple(runpath),
        hip_fatbin=_section_bytes(elf, ".hip_fatbin", file_size) if with_fatbin else None,
        amdgpu_processor=amdgpu_processor(elf["e_flags"]) if machine == "EM_AMDGPU" else None,
    )


# Tags of the dynamic section: the generic ones (the standard defines up to 0x25 so far; newer
# ones pyelftools may not name yet, such as DT_RELR, stay welcome) and the ranges left to
# operating systems and processors. Anything else is not a dynamic section.
_KNOWN_TAG_RANGES = (range(0, 0x1000), range(0x6000000D, 0x80000000))
_STRING_TAGS = ("DT_NEEDED", "DT_SONAME", "DT_RPATH", "DT_RUNPATH")


def _check_dynamic(elf: ELFFile, section: DynamicSection, file_size: int) -> None:
    """Refuse a dynamic section the loader could not use: outside the file, entries of the wrong
    size, no string table, unknown tags, or names pointing outside the string table. (The loader
    maps such a library and then crashes the process that imports it.)"""
    _within_file(section, file_size)
    entry_size = 16 if elf.elfclass == 64 else 8
    if section["sh_entsize"] != entry_size:
        raise ValueError(f"dynamic section: entries of {section['sh_entsize']} bytes, not {entry_size}")
    strings = elf.get_section(section["sh_link"]) if 0 < section["sh_link"] < elf.num_sections() else None
    if strings is None or strings["sh_type"] != "SHT_STRTAB":
        raise ValueError(f"dynamic section: its string table (section {section['sh_link']}) is not one")
    _within_file(strings, file_size)
    for index, tag in enumerate(section.iter_tags()):
        kind = tag.entry.d_tag
        if isinstance(kind, int) and not any(kind in tags for tags in _KNOWN_TAG_RANGES):
            raise ValueError(f"dynamic section: entry {index} has the unknown tag 0x{kind:x}")
        if kind in _STRING_TAGS and tag.entry.d_val >= strings["sh_size"]:
            raise ValueError(f"dynamic section: entry {index} ({kind}) names a string past the end of its table")


def _check_header_tables(elf: ELFFile, file_size: int) -> None:
    """The program and section header tables lie inside the file with entries of the standard size
    (auditwheel and the loader read them all; pyelftools would read garbage past the end)."""
    wide = elf.elfclass == 64
    for table, offset, count, size, standard in (
        ("program header", "e_phoff", "e_phnum", "e_phentsize", 56 if wide else 32),
        ("section header", "e_shoff", "e_shnum", "e_shentsize", 64 if wide else 40),
    ):
        if not elf[count]:
            continue
        if elf[size] != standard:
            raise ValueError(f"{table} entries of {elf[size]} bytes, not {standard}")
        end = elf[offset] + elf[count] * elf[size]
        if end > file_size:
            raise ValueError(f"the {table} table ends at 0x{end:x}, past the end of the file (0x{file_size:x} bytes)")


def _check_versions(section: Any, file_size: int) -> None:
    """Read every entry of a symbol version section (``.gnu.version_r``/``_d``), as loader and
    auditwheel will: one that does not parse is a damaged file, not "needs no versions"."""
    _within_file(section, file_size)
    try:
        for _, auxiliaries in section.iter_versions():
            for auxiliary in auxiliaries:
                auxiliary.name  # noqa: B018 (resolving the name is the check)
    except (ELFError, ConstructError, UnicodeDecodeError) as exc:
        raise ValueError(f"section {section.name} does not parse: {exc}") from None


def _within_file(section: Any, file_size: int) -> None:
    end = section["sh_offset"] + section["sh_size"]
    if section["sh_type"] != "SHT_NOBITS" and end > file_size:
        raise ValueError(f"section {section.name} ends at 0x{end:x}, past the end of the file (0x{file_size:x} bytes)")


def section_span(path: str | os.PathLike[str], name: str) -> tuple[int, int] | None:
    """(file offset, size) of section ``name`` of the ELF file ``path``, for reading it from a
    mapping of the file rather than into memory; None if it has no such section."""
    try:
        with open(path, "rb") as stream:
            elf = ELFFile(stream)
            section = _section(elf, name, os.fstat(stream.fileno()).st_size)
            return (section["sh_offset"], section["sh_size"]) if section is not None else None
    except OSError as exc:
        raise ElfError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except (ELFError, ConstructError, AssertionError, ValueError) as exc:
        raise ElfError(f"{path}: not a readable ELF file: {exc}") from exc


def _section_bytes(elf: ELFFile, name: str, file_size: int) -> bytes | None:
    section = _section(elf, name, file_size)
    return section.data() if section is not None else None


def _section(elf: ELFFile, name: str, file_size: int) -> Any:  # a pyelftools Section
    section = elf.get_section_by_name(name)
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return None
    # Checked first: pyelftools would try to allocate a garbled size, and returns short data
    # from a truncated file.
    end = section["sh_offset"] + section["sh_size"]
    if end > file_size:
        raise ValueError(f"section {name} ends at 0x{end:x}, past the end of the file (0x{file_size:x} bytes)")
    return section


def _tag_string(tag: DynamicTag, name: str) -> str:
    """The string pyelftools attaches to a dynamic tag under ``name`` (set at run time, so untyped)."""
    value = getattr(tag, name)
    if not isinstance(value, str):
        raise TypeError(f"dynamic tag {tag.entry.d_tag} has no string {name}")
    return value
