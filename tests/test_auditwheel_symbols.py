"""auditwheel's symbol scans and platform reads, answered once per file (read_once), give
auditwheel's own answers: on this machine's libraries, Python extensions, and a table that only
auditwheel's code may read."""

from __future__ import annotations

import shutil
import struct
import sysconfig
from pathlib import Path
from typing import Any

import auditwheel.elfutils
import auditwheel.lddtree
import auditwheel.wheel_abi
from elftools.elf.elffile import ELFFile

from pipeline.repair.auditwheel_symbols import read_once
from pipeline.util.cmd import run
from pipeline.wheel.elf import is_elf


def _answers(path: Path) -> tuple[Any, ...]:  # auditwheel ships no types: its answers are Any
    """What auditwheel's analysis asks of one file, through the names it calls them by."""
    with path.open("rb") as stream:
        elf = auditwheel.lddtree.ELFFile(stream)
        return (
            auditwheel.elfutils.get_undefined_symbols(path),
            auditwheel.wheel_abi.elf_is_python_extension(path, elf),
            auditwheel.wheel_abi.elf_references_pyfpe_jbuf(elf),
            list(auditwheel.wheel_abi.elf_find_ucs2_symbols(elf)),
            vars(auditwheel.lddtree._get_platform(elf)),
            [segment.header for segment in elf.iter_segments()],
            [tag.entry for tag in elf.get_section_by_name(".dynamic").iter_tags()],
        )


def _files() -> list[Path]:
    folder = Path("/usr/lib") / (sysconfig.get_config_var("MULTIARCH") or "")
    libraries = sorted({p.resolve() for p in folder.glob("lib*.so*") if is_elf(p)}, key=lambda p: p.stat().st_size)
    extensions = sorted(Path(sysconfig.get_path("platlib")).glob("*/*.so"))
    # Of all sizes, and Python extensions (their init function is what one of the scans looks for).
    return libraries[:: max(1, len(libraries) // 30)] + extensions[:: max(1, len(extensions) // 10)]


def test_the_answers_are_auditwheels_own() -> None:
    files = _files()
    assert files
    expected = {path: _answers(path) for path in files}
    with read_once():
        for path in files:
            assert _answers(path) == expected[path], path
            assert _answers(path) == expected[path], path  # and from what it kept
    assert any(answer[1][0] for answer in expected.values())  # a Python extension among them


def test_functions_are_auditwheels_again_after() -> None:
    before = auditwheel.elfutils.get_undefined_symbols, auditwheel.lddtree.ELFFile
    with read_once():
        assert auditwheel.elfutils.get_undefined_symbols is not before[0]
    assert (auditwheel.elfutils.get_undefined_symbols, auditwheel.lddtree.ELFFile) == before


def test_a_table_of_another_entry_size_is_left_to_auditwheel(tmp_path: Path) -> None:
    source = tmp_path / "lib.c"
    source.write_text("extern int outside(void);\nint PyInit_lib(void) { return outside(); }\n")
    library = tmp_path / "lib.so"
    run(["gcc", "-shared", "-fPIC", source, "-o", library])
    odd = tmp_path / "odd.so"
    shutil.copy(library, odd)
    with odd.open("r+b") as stream:
        elf = ELFFile(stream)
        index = next(i for i, s in enumerate(elf.iter_sections()) if s.name == ".dynsym")
        header = elf["e_shoff"] + index * elf["e_shentsize"]
        stream.seek(header + 56)  # sh_entsize of an ELF64 section header
        stream.write(struct.pack("<Q", 12))  # a divisor of the table size, not a symbol's size
        stream.seek(header + 32)
        size = struct.unpack("<Q", stream.read(8))[0]
    assert size % 12 == 0
    expected = _answers(odd)
    with read_once():
        assert _answers(odd) == expected
        assert _answers(library)[1] == (True, 3)
