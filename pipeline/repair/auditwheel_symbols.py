"""auditwheel's scans of ELF files, each file read once and its symbol table without pyelftools.

auditwheel's analysis walks every dynamic symbol through pyelftools (tens of microseconds each),
once to tell a Python extension, once for ``PyFPE_jbuf``, and again for every platform policy
whose blacklist the file may break: 16 walks of a 159,000-symbol MLIR library cost flydsl's
analysis a minute. Within :func:`read_once`, the same questions get the same answers from one
``struct`` pass over ``.dynsym`` per file, and auditwheel's reading of an ELF file's platform
(every section header, parsed) is done once per file too, not once per file that needs it.
Anything outside the common case (a compressed or odd-sized symbol table, a name past its string
table) is left to auditwheel's own code, so the answers are auditwheel's. Three costs that do not
change an answer are cut too: pyelftools' parsers are built once per kind of file, not per
opening; the symbol hash tables, which auditwheel never reads, are not parsed; and the dependency
trees are not formatted as JSON for debug messages nobody sees (cupy-rocm's analysis: 1.55 s to
0.72 s, benchmarks/README.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import auditwheel.elfutils
import auditwheel.lddtree
import auditwheel.wheel_abi
import elftools.elf.elffile
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import Section, SymbolTableSection
from elftools.elf.structs import ELFStructs

_SHN_UNDEF = 0
_STB_WEAK = 2
_STT_NOTYPE, _STT_FUNC = 0, 2
# An entry's (st_name, st_info, st_shndx), per (ELF class, little endian); the rest skipped.
_ENTRY = {
    (64, True): struct.Struct("<IBxH16x"),
    (64, False): struct.Struct(">IBxH16x"),
    (32, True): struct.Struct("<I8xBxH"),
    (32, False): struct.Struct(">I8xBxH"),
}


class _Symbols:
    """One file's dynamic symbols, as auditwheel's scans see them."""

    def __init__(self, entries: list[tuple[int, int, int]], names: bytes) -> None:
        self.entries = entries  # (st_name, st_info, st_shndx), in table order
        self.names = names  # the linked string table, ending in NUL

    @functools.cached_property
    def undefined(self) -> list[tuple[str, int, int]]:
        """(name, binding, type) of every undefined symbol, named as pyelftools names it."""
        names = self.names
        return [
            (names[offset : names.index(b"\0", offset)].decode("utf-8", errors="replace"), info >> 4, info & 0xF)
            for offset, info, section in self.entries
            if section == _SHN_UNDEF
        ]

    def defined_function(self, names: Iterable[str]) -> str | None:
        """The first defined function in the table named one of ``names`` (ASCII), if any."""
        wanted = {}
        for name in names:
            encoded = name.encode("ascii") + b"\0"
            start = self.names.find(encoded)
            while start != -1:  # string tables share suffixes: a name may start inside a longer one
                wanted[start] = name
                start = self.names.find(encoded, start + 1)
        for offset, info, section in self.entries:
            if offset in wanted and section != _SHN_UNDEF and info & 0xF == _STT_FUNC:
                return wanted[offset]
        return None


class _Cache:
    """What :func:`read_once` keeps, per file (device, inode, size, modification time)."""

    def __init__(self) -> None:
        self.symbols: dict[tuple[int, ...], _Symbols | None] = {}
        self.platforms: dict[tuple[int, ...], Any] = {}


_cache: _Cache | None = None


def _identity(stream: Any) -> tuple[int, ...]:
    status = os.fstat(stream.fileno())
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def _symbols(elf: ELFFile) -> _Symbols | None:
    """``elf``'s dynamic symbols, or None where auditwheel's own scan must answer."""
    assert _cache is not None
    key = _identity(elf.stream)
    if key not in _cache.symbols:
        _cache.symbols[key] = _read_symbols(elf)
    return _cache.symbols[key]


def _read_symbols(elf: ELFFile) -> _Symbols | None:
    section = elf.get_section_by_name(".dynsym")
    entry = _ENTRY.get((elf.elfclass, elf.little_endian))
    # pyelftools' answers where they may differ from a plain reading: no table (or another kind
    # of section by that name), entries of another size, compressed sections.
    if type(section) is not SymbolTableSection or entry is None or section["sh_entsize"] != entry.size:
        return None
    strings = section.stringtable
    if section.compressed or strings.compressed:
        return None
    names = strings.data()
    entries = list(entry.iter_unpack(section.data()))
    # A name that is not NUL-terminated within its table pyelftools reads on into the file.
    if not names.endswith(b"\0") or max((offset for offset, _, _ in entries), default=0) >= len(names):
        return None
    return _Symbols(entries, names)


def _undefined_symbols(original: Callable[[Path], set[str]]) -> Callable[[Path], set[str]]:
    def get_undefined_symbols(path: Path) -> set[str]:
        with path.open("rb") as stream:
            symbols = _symbols(ELFFile(stream))
        if symbols is None:
            return original(path)
        return {name for name, binding, _ in symbols.undefined if binding != _STB_WEAK}

    return get_undefined_symbols


def _python_extension(original: Callable[..., tuple[bool, int | None]]) -> Callable[..., tuple[bool, int | None]]:
    def elf_is_python_extension(fn: Path, elf: ELFFile) -> tuple[bool, int | None]:
        module = fn.name.split(".", 1)[0]
        symbols = _symbols(elf) if module.isascii() else None
        if symbols is None:
            return original(fn, elf)
        init = {"init" + module: 2, "PyInit_" + module: 3, "_cffi_pypyinit_" + module: 2}
        found = symbols.defined_function(init)
        return (False, None) if found is None else (True, init[found])

    return elf_is_python_extension


def _pyfpe(original: Callable[[ELFFile], bool]) -> Callable[[ELFFile], bool]:
    def elf_references_pyfpe_jbuf(elf: ELFFile) -> bool:
        symbols = _symbols(elf)
        if symbols is None:
            return original(elf)
        offending = ("PyFPE_jbuf", "PyFPE_dummy", "PyFPE_counter")
        return any(name in offending and kind in (_STT_FUNC, _STT_NOTYPE) for name, _, kind in symbols.undefined)

    return elf_references_pyfpe_jbuf


def _ucs2(original: Callable[[ELFFile], Iterator[str]]) -> Callable[[ELFFile], Iterator[str]]:
    def elf_find_ucs2_symbols(elf: ELFFile) -> Iterator[str]:
        symbols = _symbols(elf)
        if symbols is None:
            yield from original(elf)
            return
        yield from (name for name, _, kind in symbols.undefined if "PyUnicodeUCS2_" in name and kind == _STT_FUNC)

    return elf_find_ucs2_symbols


def _platform(original: Callable[[ELFFile], Any]) -> Callable[[ELFFile], Any]:
    def _get_platform(elf: ELFFile) -> Any:
        assert _cache is not None
        key = _identity(elf.stream)
        if key not in _cache.platforms:
            _cache.platforms[key] = original(elf)
        return _cache.platforms[key]

    return _get_platform


class _SectionsOnce(ELFFile):
    """pyelftools' ELFFile, each section and segment made once: it makes them anew on every
    lookup, and every dynamic segment looks for its string table through all sections (twice per
    file that auditwheel's ``ldd`` reads). A symbol hash table is made a plain section: pyelftools
    parses one whole when it makes it (a third of cupy-rocm's analysis), and auditwheel reads none."""

    def __init__(self, stream: Any, *args: Any, **kwargs: Any) -> None:
        self._sections: dict[int, Any] = {}
        self._segments: dict[int, Any] = {}
        super().__init__(stream, *args, **kwargs)

    def get_section(self, n: int, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # a type check: as pyelftools does it
            return super().get_section(n, *args, **kwargs)
        if n not in self._sections:
            self._sections[n] = super().get_section(n)
        return self._sections[n]

    def get_segment(self, n: int) -> Any:
        if n not in self._segments:
            self._segments[n] = super().get_segment(n)
        return self._segments[n]

    def _make_section(self, section_header: Any) -> Any:
        if section_header["sh_type"] in ("SHT_HASH", "SHT_GNU_HASH"):
            return Section(section_header, self._get_section_name(section_header), self)
        return super()._make_section(section_header)


class _StructsOnce(ELFStructs):
    """pyelftools' parsers of ELF structures, built once per kind of file (byte order, class,
    type, machine, OS ABI) rather than once per ELFFile: auditwheel opens each file a dozen times,
    and building them was a third of its analysis. The parsers hold no state of a file."""

    _built: ClassVar[dict[tuple[Any, ...], dict[str, Any]]] = {}

    def create_basic_structs(self) -> None:
        self._once((), super().create_basic_structs)

    def create_advanced_structs(self, *kind: Any) -> None:
        self._once(kind, lambda: super(_StructsOnce, self).create_advanced_structs(*kind))

    def _once(self, kind: tuple[Any, ...], build: Callable[[], None]) -> None:
        key = (self.little_endian, self.elfclass, len(kind), *kind)
        if key not in self._built:
            build()
            self._built[key] = dict(vars(self))
        vars(self).update(self._built[key])


class _Unshown:
    """auditwheel's json module, where it only formats debug messages (quiet here): whole
    dependency trees were put into JSON for nothing."""

    @staticmethod
    def dumps(obj: object) -> str:
        return "(not shown)"


def _sections_once(original: type[ELFFile]) -> type[ELFFile]:
    return _SectionsOnce


def _structs_once(original: type[ELFStructs]) -> type[ELFStructs]:
    return _StructsOnce


def _unshown(original: Any) -> Any:
    return _Unshown


# (module, name, wrapper): where auditwheel looks each function up when it calls it.
_REPLACED: tuple[tuple[Any, str, Callable[[Any], Any]], ...] = (
    (auditwheel.elfutils, "get_undefined_symbols", _undefined_symbols),
    (auditwheel.wheel_abi, "elf_is_python_extension", _python_extension),
    (auditwheel.wheel_abi, "elf_references_pyfpe_jbuf", _pyfpe),
    (auditwheel.wheel_abi, "elf_find_ucs2_symbols", _ucs2),
    (auditwheel.lddtree, "_get_platform", _platform),
    (auditwheel.lddtree, "ELFFile", _sections_once),
    (elftools.elf.elffile, "ELFStructs", _structs_once),
    (auditwheel.wheel_abi, "json", _unshown),
)


@contextlib.contextmanager
def read_once() -> Iterator[None]:
    """Within: auditwheel's symbol scans and platform reads answered once per file (see above)."""
    global _cache
    originals = [(module, name, getattr(module, name)) for module, name, _ in _REPLACED]
    _cache = _Cache()
    try:
        for module, name, wrapper in _REPLACED:
            setattr(module, name, wrapper(getattr(module, name)))
        yield
    finally:
        for module, name, original in originals:
            setattr(module, name, original)
        _cache = None
