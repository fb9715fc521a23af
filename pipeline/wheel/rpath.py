"""Set or remove an ELF file's DT_RPATH in place, without rewriting the file.

patchelf reads the whole file into memory and writes it out again: for a library of hundreds of MB
that is most of a repair's time on a machine where page faults are dear (benchmarks/README.md),
and twice the library's size in memory while it grows one. Here only a few bytes change:

- when the new value fits in the old string, the string in ``.dynstr`` and the entries of
  ``.dynamic`` are overwritten;
- otherwise (a longer path, a library with no search path yet) the string table is copied, with
  the new string at its end, into a new read-only segment appended to the file. ``DT_STRTAB``,
  ``DT_STRSZ`` and the ``.dynstr`` section header point at the copy; every old string keeps its
  offset. The program header table gains the new segment's entry where it is, as patchelf grows
  it: the sections that entry overlaps (a note, a hash table) move to the new segment too, with
  every header and dynamic entry that points at them. A new dynamic entry takes one of the spare
  DT_NULL slots GNU ld leaves at the end of ``.dynamic``.

Anything else (not 64-bit little-endian, an executable, no section headers, no spare slot, what
would move is not read-only data) is left to patchelf. The result is what ``patchelf --force-rpath --set-rpath`` or
``--remove-rpath`` gives the loader: one DT_RPATH with the new value (a DT_RUNPATH becomes it) or
none of either.

:func:`edit_in_place` also renames needed libraries and the file's own soname, as auditwheel's
grafting asks (``patchelf --replace-needed``, ``--set-soname``): the new names go into the copied
string table, and ``DT_NEEDED``, ``DT_SONAME`` and the version needs naming a renamed library
(``vn_file``, which the loader matches against the library it loaded) point at them.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVersionSection

DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 14, 15, 29
_SEARCH_PATHS = (DT_RPATH, DT_RUNPATH)
# Dynamic entries whose value is an offset into the dynamic string table (the ELF gABI, and
# DT_AUXILIARY, DT_FILTER, DT_CONFIG, DT_DEPAUDIT, DT_AUDIT of GNU/Solaris).
_STRING_TAGS = frozenset(
    {DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH, 0x7FFFFFFD, 0x7FFFFFFF, 0x6FFFFEFA, 0x6FFFFEFB, 0x6FFFFEFC}
)
# ELF64 little-endian structures, the only kind edited here: Elf64_Dyn, Elf64_Phdr, Elf64_Sym's
# st_name, Elf64_Shdr, and e_phnum of Elf64_Ehdr.
_ENTRY = struct.Struct("<qQ")
_PHDR = struct.Struct("<IIQQQQQQ")
_SYMBOL_NAMES = struct.Struct("<I20x")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_VERNEED = struct.Struct("<HHIII")  # Elf64_Verneed: vn_version, vn_cnt, vn_file, vn_aux, vn_next
_WORD = struct.Struct("<I")
# Where the fields used lie in a program header and a section header, as unpacked.
_P_TYPE, _P_OFFSET, _P_VADDR, _P_PADDR, _P_FILESZ, _P_MEMSZ, _P_ALIGN = 0, 2, 3, 4, 5, 6, 7
_SH_TYPE, _SH_FLAGS, _SH_ADDR, _SH_OFFSET, _SH_SIZE = 1, 2, 3, 4, 5
_HALF = struct.Struct("<H")
_E_PHNUM = 0x38  # where the ELF header counts the program headers
PT_LOAD, PT_INTERP, PT_PHDR, PF_R = 1, 3, 6, 4
SHT_STRTAB, SHT_NOBITS, SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 3, 8, 1, 2, 4
# Dynamic entries whose value is an address (d_ptr): PLTGOT, HASH, STRTAB, SYMTAB, RELA, INIT, FINI,
# REL, DEBUG, JMPREL, INIT_ARRAY, FINI_ARRAY, PREINIT_ARRAY, RELR, and GNU's GNU_HASH, TLSDESC_PLT,
# TLSDESC_GOT, GNU_CONFLICT, GNU_LIBLIST, PLTPAD, MOVETAB, SYMINFO, VERSYM, VERDEF, VERNEED.
_POINTER_TAGS = frozenset(
    {
        3,
        4,
        5,
        6,
        7,
        12,
        13,
        17,
        21,
        23,
        25,
        26,
        32,
        36,
        0x6FFFFEF5,
        0x6FFFFEF6,
        0x6FFFFEF7,
        0x6FFFFEF8,
        0x6FFFFEF9,
        0x6FFFFEFD,
        0x6FFFFEFE,
        0x6FFFFEFF,
        0x6FFFFFF0,
        0x6FFFFFFC,
        0x6FFFFFFE,
    }
)
# Tables of names in .dynstr, by the dynamic entry that announces them: DT_SYMTAB, DT_VERNEED, DT_VERDEF.
_NAME_TABLES = {6: ".dynsym", 0x6FFFFFFE: ".gnu.version_r", 0x6FFFFFFC: ".gnu.version_d"}

Writes = list[tuple[int, bytes]]  # (file offset, bytes)


def set_rpath_in_place(path: Path, entries: Sequence[str]) -> bool:
    """Make ``path``'s search path one DT_RPATH of ``entries`` (none at all when empty), in place.

    False, with the file untouched, when the file is not one this handles (see the module).
    """
    return edit_in_place(path, rpath=entries)


def edit_in_place(
    path: Path,
    *,
    rpath: Sequence[str] | None = None,
    needed: Mapping[str, str] | None = None,
    soname: str | None = None,
) -> bool:
    """In place: the search path set as :func:`set_rpath_in_place` sets it (unless ``rpath`` is
    None), the needed libraries of ``needed`` (old name -> new) renamed, and the soname set.

    False, with the file untouched, when the file is not one this handles (see the module), or
    does not need a library ``needed`` names.
    """
    value = None if rpath is None else ":".join(rpath).encode()
    with open(path, "r+b") as file:
        try:
            if needed or soname is not None:
                edit = _plan_names(
                    file, value, {old.encode(): new.encode() for old, new in (needed or {}).items()}, soname
                )
            elif value is not None:
                edit = _plan(file, value)
            else:
                return True
        except (ELFError, struct.error, ValueError):
            return False
        if edit is None:
            return False
        for offset, data in edit:  # in order (see _append)
            os.pwrite(file.fileno(), data, offset)
    return True


@dataclass(frozen=True)
class _Dynamic:
    """The parts of a file's dynamic linking that a search path lives in."""

    elf: ELFFile
    offset: int  # of the .dynamic table in the file
    entries: list[tuple[int, int]]  # (tag, value) up to the first DT_NULL
    slots: int  # entries the table has room for, DT_NULLs included
    strtab: int  # file offset of the string table
    strings: bytes

    def table(self, entries: list[tuple[int, int]]) -> tuple[int, bytes]:
        """The write that gives .dynamic ``entries``, ended and padded with DT_NULL."""
        padded = entries + [(DT_NULL, 0)] * (max(len(self.entries) + 1, len(entries) + 1) - len(entries))
        return self.offset, b"".join(_ENTRY.pack(*entry) for entry in padded)


def _plan(file: BinaryIO, value: bytes) -> Writes | None:
    """The writes that give ``file`` the search path ``value``, or None."""
    dynamic = _read_dynamic(file)
    if dynamic is None:
        return None
    entries = dynamic.entries
    search = [i for i, (tag, _) in enumerate(entries) if tag in _SEARCH_PATHS]
    if not value:
        return [dynamic.table([entry for entry in entries if entry[0] not in _SEARCH_PATHS])]
    # The entry kept is the one with the most room; the others go, as patchelf removes them.
    lengths = {i: dynamic.strings.index(b"\0", entries[i][1]) - entries[i][1] for i in search}
    kept = max(search, key=lambda i: lengths[i]) if search else None
    if kept is not None and len(value) <= lengths[kept] and _only_reference(dynamic.elf, entries, kept, lengths[kept]):
        start = entries[kept][1]
        string = (dynamic.strtab + start, value + b"\0" * (lengths[kept] - len(value) + 1))
        return [string, dynamic.table(_with_search_path(entries, kept, start))]
    entries = _with_search_path(list(entries), kept, len(dynamic.strings))
    return _append(file, dynamic, value + b"\0", entries, [])


def _plan_names(file: BinaryIO, value: bytes | None, needed: dict[bytes, bytes], soname: str | None) -> Writes | None:
    """The writes that rename ``needed`` libraries and set the soname (and the search path to
    ``value`` unless None): always in a new segment, the new names being longer as a rule."""
    dynamic = _read_dynamic(file)
    if dynamic is None:
        return None
    strings = dynamic.strings
    added = bytearray()

    def new_string(name: bytes) -> int:
        added.extend(name + b"\0")
        return len(strings) + len(added) - len(name) - 1

    def name_at(offset: int) -> bytes:
        return strings[offset : strings.index(b"\0", offset)]

    renamed = {old: new_string(new) for old, new in needed.items()}
    entries = list(dynamic.entries)
    if not set(renamed) <= {name_at(val) for tag, val in entries if tag == DT_NEEDED}:
        return None  # a library it does not need: left to patchelf
    entries = [(tag, renamed.get(name_at(val), val)) if tag == DT_NEEDED else (tag, val) for tag, val in entries]
    if soname is not None:
        at = new_string(soname.encode())
        has_soname = any(tag == DT_SONAME for tag, _ in entries)
        entries = [(tag, at if tag == DT_SONAME else val) for tag, val in entries]
        if not has_soname:
            entries.insert(0, (DT_SONAME, at))
    search = [i for i, (tag, _) in enumerate(entries) if tag in _SEARCH_PATHS]
    if value == b"":
        entries = [entry for entry in entries if entry[0] not in _SEARCH_PATHS]
    elif value is not None:
        entries = _with_search_path(entries, search[0] if search else None, new_string(value))
    # The version needs of a renamed library name it too; the loader compares that name.
    version_needs = [
        (at, renamed[name_at(name)]) for at, name in _version_need_files(dynamic) if name_at(name) in renamed
    ]
    return _append(file, dynamic, bytes(added), entries, version_needs)


def _version_need_files(dynamic: _Dynamic) -> Iterator[tuple[int, int]]:
    """(file offset of its vn_file, the string offset there) for each version need."""
    section = dynamic.elf.get_section_by_name(".gnu.version_r")
    if section is None:
        return
    at, count = section["sh_offset"], section["sh_info"]
    stream = dynamic.elf.stream
    for _ in range(count):
        stream.seek(at)
        _, _, name, _, following = _VERNEED.unpack(stream.read(_VERNEED.size))
        yield at + 4, name  # vn_file follows vn_version and vn_cnt
        if not following:
            break
        at += following


def _read_dynamic(file: BinaryIO) -> _Dynamic | None:
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
    tags = dict(entries[:end])
    strtab = _file_offset(segments, tags.get(DT_STRTAB))
    if strtab is None or DT_STRSZ not in tags:
        return None
    file.seek(strtab)
    strings = file.read(tags[DT_STRSZ])
    return _Dynamic(elf, dynamic["p_offset"], entries[:end], len(entries), strtab, strings)


def _with_search_path(entries: list[tuple[int, int]], kept: int | None, string: int) -> list[tuple[int, int]]:
    """``entries`` with one DT_RPATH at ``string``: entry ``kept`` becomes it, other search paths go."""
    new = [
        (DT_RPATH, string) if i == kept else entry
        for i, entry in enumerate(entries)
        if i == kept or entry[0] not in _SEARCH_PATHS
    ]
    return new if kept is not None else [*new, (DT_RPATH, string)]


def _append(
    file: BinaryIO, dynamic: _Dynamic, added: bytes, edited: list[tuple[int, int]], words: list[tuple[int, int]]
) -> Writes | None:
    """The writes that give ``file`` a copy of its string table, ``added`` at its end, in a new
    segment, the dynamic entries ``edited`` (their string offsets into that copy), and each
    32-bit string offset of ``words`` (file offset, value) written."""
    header = dynamic.elf.header
    if (
        header["e_type"] != "ET_DYN"
        or header["e_phentsize"] != _PHDR.size
        or header["e_shentsize"] != _SHDR.size
        or not header["e_shnum"]
    ):
        return None
    phdrs = _read_table(file, header["e_phoff"], header["e_phnum"], _PHDR)
    shdrs = _read_table(file, header["e_shoff"], header["e_shnum"], _SHDR)
    loads = [phdr for phdr in phdrs if phdr[_P_TYPE] == PT_LOAD]
    strtab_address = dict(dynamic.entries)[DT_STRTAB]
    strtab = next(
        (i for i, shdr in enumerate(shdrs) if shdr[_SH_TYPE] == SHT_STRTAB and shdr[_SH_ADDR] == strtab_address), None
    )
    # The program header table grows where it is (strip, for one, expects it in the first segment).
    grown = header["e_phoff"] + (len(phdrs) + 1) * _PHDR.size
    first = next(
        (load for load in loads if load[_P_OFFSET] <= header["e_phoff"] and grown <= load[_P_OFFSET] + load[_P_FILESZ]),
        None,
    )
    # An executable's program headers are also read by the kernel: those stay patchelf's.
    if first is None or strtab is None or any(phdr[_P_TYPE] == PT_INTERP for phdr in phdrs):
        return None
    moved = _displaced(phdrs, shdrs, header["e_phoff"] + len(phdrs) * _PHDR.size, grown)
    if moved is None or moved[1] > first[_P_OFFSET] + first[_P_FILESZ]:
        return None
    low, high = moved
    to_memory = first[_P_VADDR] - first[_P_OFFSET]  # from a file offset to its address, in the first segment
    # The new segment: past the file's end and every segment's memory (.bss included), at an offset
    # and address congruent modulo the segments' alignment (as the loader maps pages) and to the
    # moved bytes'.
    align = max(load[_P_ALIGN] for load in loads) or 1
    offset = _round_up(os.fstat(file.fileno()).st_size, align) + low % align
    address = _round_up(max(load[_P_VADDR] + load[_P_MEMSZ] for load in loads), align) + low % align
    by_offset, by_address = offset - low, address - (low + to_memory)
    file.seek(low)
    block = file.read(high - low)
    table = dynamic.strings + added
    new_strtab = {DT_STRTAB: address + len(block), DT_STRSZ: len(table)}
    entries = [
        (tag, new_strtab.get(tag, val + by_address if tag in _POINTER_TAGS and low <= val - to_memory < high else val))
        for tag, val in edited
    ]
    if len(entries) + 1 > dynamic.slots:
        return None  # no spare DT_NULL for the new entry
    for phdr in phdrs:
        if phdr[_P_TYPE] == PT_PHDR:
            phdr[_P_FILESZ] = phdr[_P_MEMSZ] = grown - header["e_phoff"]
        elif phdr[_P_TYPE] != PT_LOAD and low <= phdr[_P_OFFSET] < high:
            phdr[_P_OFFSET] += by_offset
            phdr[_P_VADDR] += by_address
            phdr[_P_PADDR] += by_address
    size = len(block) + len(table)
    # Loadable segments stay sorted by address, as the loader expects.
    phdrs.insert(phdrs.index(loads[-1]) + 1, [PT_LOAD, PF_R, offset, address, address, size, size, align])
    for shdr in shdrs:
        if shdr[_SH_SIZE] and low <= shdr[_SH_OFFSET] < high:
            shdr[_SH_ADDR] += by_address
            shdr[_SH_OFFSET] += by_offset
    shdrs[strtab][_SH_ADDR], shdrs[strtab][_SH_OFFSET], shdrs[strtab][_SH_SIZE] = (
        address + len(block),
        offset + len(block),
        len(table),
    )
    relocated = bytearray(block)
    kept_in_place: Writes = []
    for at, word in words:  # into the moved bytes, or where they are
        if low <= at < high:
            _WORD.pack_into(relocated, at - low, word)
        else:
            kept_in_place.append((at, _WORD.pack(word)))
    # The new segment first: until the headers point at it, it is inert.
    return [
        (offset, bytes(relocated) + table),
        (header["e_shoff"], b"".join(_SHDR.pack(*shdr) for shdr in shdrs)),
        dynamic.table(entries),
        (header["e_phoff"], b"".join(_PHDR.pack(*phdr) for phdr in phdrs)),
        (_E_PHNUM, _HALF.pack(len(phdrs))),
        *kept_in_place,
    ]


def _read_table(file: BinaryIO, offset: int, count: int, entry: struct.Struct) -> list[list[int]]:
    file.seek(offset)
    return [list(fields) for fields in entry.iter_unpack(file.read(count * entry.size))]


def _displaced(phdrs: list[list[int]], shdrs: list[list[int]], start: int, end: int) -> tuple[int, int] | None:
    """The file range of the sections and notes that the bytes [start, end) overlap, widened until
    nothing lies across its ends; empty at ``end`` when nothing is there. None when what would move
    cannot (it is not read-only loaded data, or it begins before ``start``)."""
    spans = [
        (shdr[_SH_OFFSET], shdr[_SH_OFFSET] + shdr[_SH_SIZE], shdr[_SH_FLAGS])
        for shdr in shdrs
        if shdr[_SH_TYPE] != SHT_NOBITS and shdr[_SH_SIZE]
    ]
    spans += [
        (phdr[_P_OFFSET], phdr[_P_OFFSET] + phdr[_P_FILESZ], SHF_ALLOC)
        for phdr in phdrs
        if phdr[_P_TYPE] not in (PT_LOAD, PT_PHDR) and phdr[_P_FILESZ]
    ]
    low, high = end, end
    reach = (start, end)
    while hit := [span for span in spans if span[0] < reach[1] and span[1] > reach[0]]:
        low, high = min(span[0] for span in hit), max(span[1] for span in hit)
        if (min(start, low), max(end, high)) == reach:
            break
        reach = (min(start, low), max(end, high))
    if low < start or any(
        flags & (SHF_WRITE | SHF_EXECINSTR) or not flags & SHF_ALLOC for begin, _, flags in spans if low <= begin < high
    ):
        return None
    return low, high


def _round_up(number: int, multiple: int) -> int:
    return -(-number // multiple) * multiple


def _file_offset(segments: list[Any], address: int | None) -> int | None:
    """Where the loaded address ``address`` lies in the file."""
    for segment in segments:
        if (
            address is not None
            and segment["p_type"] == "PT_LOAD"
            and 0 <= address - segment["p_vaddr"] < segment["p_filesz"]
        ):
            offset: int = address - segment["p_vaddr"] + segment["p_offset"]
            return offset
    return None


def _only_reference(elf: ELFFile, entries: list[tuple[int, int]], kept: int, length: int) -> bool:
    """Whether nothing but entry ``kept`` uses the ``length`` bytes of its string (and their NUL): a linker
    may share a string's tail with another name (a DT_NEEDED, a symbol, a version). False too when
    the tables naming them cannot be found (no section headers)."""
    tags = {tag for tag, _ in entries}
    for tag, section in _NAME_TABLES.items():
        if tag in tags and elf.get_section_by_name(section) is None:
            return False
    start = entries[kept][1]
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
    if isinstance(needs, GNUVersionSection):
        for need, auxiliaries in needs.iter_versions():
            yield need.entry["vn_file"]
            yield from (aux.entry["vna_name"] for aux in auxiliaries)
    definitions = elf.get_section_by_name(".gnu.version_d")
    if isinstance(definitions, GNUVersionSection):
        for _, auxiliaries in definitions.iter_versions():
            yield from (aux.entry["vda_name"] for aux in auxiliaries)
