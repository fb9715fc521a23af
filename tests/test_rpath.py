"""pipeline.rpath: search paths set or removed in place, as the loader and patchelf see them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from elf_builds import Elf, build

from pipeline.elf import read_elf
from pipeline.repair import _patchelf
from pipeline.rpath import set_rpath_in_place

LONG = "{build}/a/build/machine/folder/that/is/long/enough/lib"


def _top(tmp_path: Path, **search: str) -> tuple[Path, Path]:
    """``top/libtop.so`` needing ``dep/libdep.so``, with ``search`` (rpath= or runpath=); (top, dep folder)."""
    built = build((Elf("top/libtop.so", needs=("dep/libdep.so",), **search), Elf("dep/libdep.so")), tmp_path / "build")
    return built["top/libtop.so"], built["dep/libdep.so"].parent


def _loads(library: Path) -> bool:
    """Whether the loader finds what ``library`` needs (in a fresh process, no LD_LIBRARY_PATH)."""
    code = f"import ctypes; ctypes.CDLL({str(library)!r})"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, env={}).returncode == 0


@pytest.mark.parametrize("kind", ["rpath", "runpath"])
def test_a_shorter_path_is_set_in_place_as_patchelf_sets_it(tmp_path: Path, kind: str) -> None:
    top, dep = _top(tmp_path, **{kind: f"{LONG}:/nowhere"})
    assert not _loads(top)
    by_patchelf = top.with_name("patchelf.so")
    shutil.copy(top, by_patchelf)
    subprocess.run([_patchelf(), "--force-rpath", "--set-rpath", str(dep), by_patchelf], check=True)

    assert set_rpath_in_place(top, [str(dep)])

    info, expected = read_elf(top, with_fatbin=False), read_elf(by_patchelf, with_fatbin=False)
    assert (info.rpath, info.runpath, info.needed) == ((str(dep),), (), expected.needed)
    assert (expected.rpath, expected.runpath) == (info.rpath, info.runpath)
    assert top.stat().st_size == by_patchelf.stat().st_size
    assert _loads(top)


@pytest.mark.parametrize("kind", ["rpath", "runpath"])
def test_a_path_is_removed_in_place(tmp_path: Path, kind: str) -> None:
    top, dep = _top(tmp_path, **{kind: str(tmp_path / "build" / "dep")})
    assert _loads(top)
    assert set_rpath_in_place(top, [])
    info = read_elf(top, with_fatbin=False)
    assert (info.rpath, info.runpath) == ((), ())
    assert not _loads(top)


def test_what_needs_room_is_left_to_patchelf_untouched(tmp_path: Path) -> None:
    top, dep = _top(tmp_path, rpath="/short")
    none, _ = _top(tmp_path / "none")
    for library, value in ((top, [str(dep), "/opt/rocm/lib"]), (none, ["/opt/rocm/lib"])):
        before = library.read_bytes()
        assert not set_rpath_in_place(library, value)
        assert library.read_bytes() == before


def test_a_path_sharing_its_bytes_with_another_name_is_left_to_patchelf(tmp_path: Path) -> None:
    # A folder named like the library needed: the linker may store the name once, as the path's tail.
    top, dep = _top(tmp_path, rpath="/opt/lib/libdep.so")
    needed_at = top.read_bytes().count(b"libdep.so\0")
    before = top.read_bytes()
    if needed_at != 1:
        pytest.skip("this linker stored the name twice: nothing shared")
    assert not set_rpath_in_place(top, ["/x"])
    assert top.read_bytes() == before


def test_a_file_that_is_not_elf_is_left_alone(tmp_path: Path) -> None:
    text = tmp_path / "script.so"
    text.write_text("#!/bin/sh\n")
    assert not set_rpath_in_place(text, ["/opt/rocm/lib"])
    assert text.read_text() == "#!/bin/sh\n"
