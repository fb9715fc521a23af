"""Set or remove an ELF file's DT_RPATH in place, where that needs no new room.

patchelf reads the whole file into memory and writes it out again: for a library of hundreds of MB
that is most of a repair's time on a machine where page faults are dear (459 MB: 1.9 s, against
0.15 s for a copy). Repair mostly shortens search paths (build-machine paths go, one ROCm folder
stays) or removes them, which changes a few bytes: the string in ``.dynstr`` and the entries of
``.dynamic``. Those are written here, in place; anything that needs room (a longer path, a file
with no search path yet) is left to patchelf.

The result is what ``patchelf --force-rpath --set-rpath`` or ``--remove-rpath`` gives the loader:
one DT_RPATH with the new value (a DT_RUNPATH becomes it) or none of either. The old string's
bytes past the new value become NULs.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 14, 15, 29
_SEARCH_PATHS = (DT_RPATH, DT_RUNPATH)
# Dynamic entries whose value is an offset into the dynamic string table (the ELF gABI, and
# DT_AUXILIARY, DT_FILTER, DT_CONFIG, DT_DEPAUDIT, DT_AUDIT of GNU/Solaris).
_STRING_TAGS = frozenset({DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH, 0x7FFFFFFD, 0x7FFFFFFF, 0x6FFFFEFA, 0x6FFFFEFB, 0x6FFFFEFC})
_ENTRY = struct.Struct("<qQ")  # Elf64_Dyn, little-endian: the only kind edited here
_SYMBOL_NAMES = struct.Struct("<I20x")  # st_name of each Elf64_Sym
# Tables of names in .dynstr, by the dynamic entry that announces them: DT_SYMTAB, DT_VERNEED, DT_VERDEF.
_NAME_TABLES = {6: ".dynsym", 0x6FFFFFFE: ".gnu.version_r", 0x6FFFFFFC: ".gnu.version_d"}


def set_rpath_in_place(path: Path, entries: Sequence[str]) -> bool:
    """Make ``path``'s search path one DT_RPATH of ``entries`` (none at all when empty), in place.

    False, with the file untouched, when that needs more room than the file has (patchelf's job)
    or the file is not one this handles (not 64-bit little-endian, strings shared with others).
    """
    value = ":".join(entries).encode()
    with open(path, "r+b") as file:
        try:
            edit = _plan(file, value)
        except (ELFError, struct.error, ValueError):
            return False
        if edit is None:
            return False
        for offset, data in edit:
            os.pwrite(file.fileno(), data, offset)
    return True


def _plan(file: BinaryIO, value: bytes) -> list[tuple[int, bytes]] | None:
    """The writes (file offset, bytes) that give ``file`` the search path ``value``, or None."""
    elf = ELFFile(file)
    if elf.elfclass != 64 or not elf.little_endian:
        return None
    segments = list(elf.iter_segments())
    dynamic = next((s for s in segments if s["p_type"] == "PT_DYNAMIC"), None)
    if dynamic is None:
        return None
    file.seek(dynamic["p_offset"])
    table = file.read(dynamic["p_filesz"])
    entries = [_ENTRY.unpack_from(table, at) for at in range(0, len(table) - _ENTRY.size + 1, _ENTRY.size)]
    end = next((i for i, (tag, _) in enumerate(entries) if tag == DT_NULL), None)
    if end is None:
        return None
    entries = entries[:end]
    search = [i for i, (tag, _) in enumerate(entries) if tag in _SEARCH_PATHS]
    if not search:
        return None  # a new entry and string: room only patchelf can make
    tags = dict(entries)
    strtab = _file_offset(segments, tags.get(DT_STRTAB))
    if strtab is None or DT_STRSZ not in tags:
        return None
    file.seek(strtab)
    strings = file.read(tags[DT_STRSZ])
    # The entry kept is the one with the most room; the others go, as patchelf removes them.
    lengths = {i: strings.index(b"\0", entries[i][1]) - entries[i][1] for i in search}
    kept = max(search, key=lambda i: lengths[i]) if value else None
    writes: list[tuple[int, bytes]] = []
    if kept is not None:
        start, length = entries[kept][1], lengths[kept]
        if len(value) > length or not _only_reference(elf, entries, kept, start, length):
            return None
        writes.append((strtab + start, value + b"\0" * (length - len(value) + 1)))
    new = [(DT_RPATH if i == kept else tag, val) for i, (tag, val) in enumerate(entries) if i == kept or tag not in _SEARCH_PATHS]
    new += [(DT_NULL, 0)] * (len(entries) + 1 - len(new))
    writes.append((dynamic["p_offset"], b"".join(_ENTRY.pack(*entry) for entry in new)))
    return writes


def _file_offset(segments: list[Any], address: int | None) -> int | None:
    """Where the loaded address ``address`` lies in the file."""
    for segment in segments:
        if address is not None and segment["p_type"] == "PT_LOAD" and 0 <= address - segment["p_vaddr"] < segment["p_filesz"]:
            return address - segment["p_vaddr"] + segment["p_offset"]
    return None


def _only_reference(elf: ELFFile, entries: list[tuple[int, int]], kept: int, start: int, length: int) -> bool:
    """Whether nothing but entry ``kept`` uses the string bytes [start, start + length]: a linker
    may share a string's tail with another name (a DT_NEEDED, a symbol, a version). False too when
    the tables naming them cannot be found (no section headers)."""
    tags = {tag for tag, _ in entries}
    for tag, section in _NAME_TABLES.items():
        if tag in tags and elf.get_section_by_name(section) is None:
            return False
    others = (val for i, (tag, val) in enumerate(entries) if i != kept and tag in _STRING_TAGS)
    return not any(start <= offset <= start + length for offset in (*others, *_name_offsets(elf)))


def _name_offsets(elf: ELFFile) -> Iterator[int]:
    """The ``.dynstr`` offsets of dynamic symbol and version names."""
    symbols = elf.get_section_by_name(".dynsym")
    if symbols is not None:
        if symbols["sh_entsize"] != _SYMBOL_NAMES.size:
            raise ValueError("unexpected symbol size")
        data = symbols.data()
        yield from (name for (name,) in _SYMBOL_NAMES.iter_unpack(data[: len(data) - len(data) % _SYMBOL_NAMES.size]))
    needs = elf.get_section_by_name(".gnu.version_r")
    if needs is not None:
        for need, auxiliaries in needs.iter_versions():
            yield need.entry["vn_file"]
            yield from (aux.entry["vna_name"] for aux in auxiliaries)
    definitions = elf.get_section_by_name(".gnu.version_d")
    if definitions is not None:
        for _, auxiliaries in definitions.iter_versions():
            yield from (aux.entry["vda_name"] for aux in auxiliaries)
