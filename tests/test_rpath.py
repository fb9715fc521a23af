"""pipeline.wheel.rpath: search paths set or removed in place, as the loader and patchelf see them."""

from __future__ import annotations

import glob
import itertools
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Unpack

import pytest
from elftools.elf.elffile import ELFFile

from pipeline.repair.repair import _patchelf
from pipeline.util.cmd import run
from pipeline.wheel.elf import read_elf
from pipeline.wheel.rpath import edit_in_place, set_rpath_in_place
from tests.helpers.elf_builds import Elf, SearchPaths, build

LONG = "{build}/a/build/machine/folder/that/is/long/enough/lib"


def _top(tmp_path: Path, **search: Unpack[SearchPaths]) -> tuple[Path, Path]:
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
    top, _ = _top(tmp_path, **{kind: str(tmp_path / "build" / "dep")})
    assert _loads(top)
    assert set_rpath_in_place(top, [])
    info = read_elf(top, with_fatbin=False)
    assert (info.rpath, info.runpath) == ((), ())
    assert not _loads(top)


def _lld() -> str | None:
    """A folder holding ld.lld (LLVM's linker, which leaves no spare dynamic entries), if any."""
    found = shutil.which("ld.lld") or next(iter(sorted(glob.glob("/usr/lib/llvm-*/bin/ld.lld"))), None)
    return str(Path(found).parent) if found else None


def _with_lld(library: Path, dep: Path, *flags: str) -> None:
    """Link ``library`` again with ld.lld, needing ``dep``'s libdep.so."""
    source = library.with_name(library.name + ".c")
    run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            source,
            "-o",
            library,
            "-fuse-ld=lld",
            f"-B{_lld()}",
            f"-L{dep}",
            "-l:libdep.so",
            *flags,
        ]
    )


# A library with no search path, a short one of either kind, one linked by lld (whose layout
# differs), and one patchelf has already rewritten (as auditwheel leaves a grafted library).
@pytest.mark.parametrize(
    "search", [{}, {"rpath": "/short"}, {"runpath": "/short"}, {"lld": "/short"}, {"patchelf": "/short"}]
)
def test_a_path_that_needs_room_is_set_in_a_new_segment(tmp_path: Path, search: dict[str, str]) -> None:
    top, dep = _top(tmp_path, **{kind: value for kind, value in search.items() if kind in ("rpath", "runpath")})
    if "lld" in search:
        if _lld() is None:
            pytest.skip("no ld.lld here")
        _with_lld(top, dep, "-Wl,-rpath,/short")
    if "patchelf" in search:
        subprocess.run([_patchelf(), "--force-rpath", "--set-rpath", "/short", top], check=True)
    wanted = [str(dep), "$ORIGIN/../a/longer/folder/than/any/before"]
    size, needed = top.stat().st_size, read_elf(top, with_fatbin=False).needed

    assert set_rpath_in_place(top, wanted)

    info = read_elf(top, with_fatbin=False)
    assert (info.rpath, info.runpath, info.needed) == (tuple(wanted), (), needed)
    _assert_sound_headers(top)
    # The file grew by the new segment only: nothing was rewritten.
    assert size < top.stat().st_size < size + 64 * 1024
    assert _loads(top)
    printed = subprocess.run([_patchelf(), "--print-rpath", top], capture_output=True, text=True, check=True)
    assert printed.stdout.strip() == ":".join(wanted)
    # Tools that rewrite the file keep it working: strip, and patchelf setting a path again.
    stripped = top.with_name("stripped.so")
    run(["strip", "-o", stripped, top])
    assert _loads(stripped)
    subprocess.run([_patchelf(), "--force-rpath", "--set-rpath", f"{dep}:/{'x' * 200}", top], check=True)
    assert _loads(top)


def test_a_path_sharing_its_bytes_with_another_name_gets_a_new_segment(tmp_path: Path) -> None:
    # A folder named like the library needed: the linker may store the name once, as the path's
    # tail. Writing a shorter path over it would rename what the library needs.
    top, _ = _top(tmp_path, rpath="/opt/lib/libdep.so")
    if top.read_bytes().count(b"libdep.so\0") != 1:
        pytest.skip("this linker stored the name twice: nothing shared")
    size, needed = top.stat().st_size, read_elf(top, with_fatbin=False).needed
    assert set_rpath_in_place(top, ["/x"])
    info = read_elf(top, with_fatbin=False)
    assert (info.rpath, info.needed) == (("/x",), needed)
    assert top.stat().st_size > size


def test_a_new_segment_leaves_the_zeroed_data_alone(tmp_path: Path) -> None:
    # .bss runs pages past the end of the file's data: the new segment must go past it, or the
    # loader maps it over what the library expects to be zeros.
    source = tmp_path / "bss.c"
    source.write_text(
        "volatile char zeros[3 << 20];\n"
        "int untouched(void) { for (unsigned i = 0; i < sizeof zeros; i++) if (zeros[i]) return 0; return 1; }\n"
    )
    library = tmp_path / "libbss.so"
    run(["gcc", "-shared", "-fPIC", "-O1", source, "-o", library])
    assert set_rpath_in_place(library, ["/opt/rocm/lib"])
    _assert_sound_headers(library)
    check = f"import ctypes, sys; sys.exit(ctypes.CDLL({str(library)!r}).untouched() != 1)"
    assert subprocess.run([sys.executable, "-c", check], env={}).returncode == 0


def _system_libraries(count: int) -> list[Path]:
    """Up to ``count`` of this machine's own shared libraries that load as they are, of all sizes."""
    folder = Path("/usr/lib") / (sysconfig.get_config_var("MULTIARCH") or "")
    found = sorted(
        {path.resolve() for path in folder.glob("lib*.so*") if path.is_file()}, key=lambda path: path.stat().st_size
    )
    step = max(1, len(found) // (count * 2))
    return [path for path in found[::step] if _loads(path)][:count]


def test_libraries_of_this_machine_keep_working_with_a_new_segment(tmp_path: Path) -> None:
    libraries = _system_libraries(24)
    if not libraries:
        pytest.skip("no shared libraries found in this machine's library folder")
    wanted = ["/opt/rocm/lib", "$ORIGIN/../a/folder/longer/than/any/search/path/these/libraries/carry"]
    for original in libraries:
        library = tmp_path / original.name
        shutil.copy(original, library)
        if not set_rpath_in_place(library, wanted):
            continue  # left to patchelf (say, no spare dynamic entry)
        _assert_sound_headers(library)
        assert read_elf(library, with_fatbin=False).rpath == tuple(wanted), original
        assert _loads(library), original
        stripped = tmp_path / f"stripped-{original.name}"
        run(["strip", "-o", stripped, library])
        assert _loads(stripped), original


def _assert_sound_headers(library: Path) -> None:
    """Loadable segments sorted by address, none overlapping another in memory; PT_PHDR the size of the table."""
    with open(library, "rb") as file:
        elf = ELFFile(file)
        segments = list(elf.iter_segments())
        table = elf.header["e_phnum"] * elf.header["e_phentsize"]
    assert all(s["p_filesz"] == s["p_memsz"] == table for s in segments if s["p_type"] == "PT_PHDR")
    loads = [(s["p_vaddr"], s["p_vaddr"] + s["p_memsz"]) for s in segments if s["p_type"] == "PT_LOAD"]
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(loads))


def test_a_path_set_in_a_new_segment_serves_musl_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, musl_gcc: str
) -> None:
    musl = (
        Elf("bin/program", needs=("top/libtop.so",), rpath="{build}/top", musl=True, program=True),
        Elf("top/libtop.so", needs=("dep/libdep.so",), musl=True),
        Elf("dep/libdep.so", musl=True),
    )
    # Where the linker, not the loader, finds libdep.so for the program (which does not need it itself).
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "build" / "dep"))
    built = build(musl, tmp_path / "build")
    program = built["bin/program"]
    assert subprocess.run([program], capture_output=True, env={}).returncode != 0
    assert set_rpath_in_place(built["top/libtop.so"], [str(built["dep/libdep.so"].parent), "/a/longer/path/than/none"])
    assert subprocess.run([program], capture_output=True, env={}).returncode == 0


def test_what_this_cannot_give_room_is_left_to_patchelf_untouched(tmp_path: Path) -> None:
    # A program (the kernel reads its program headers too), and a library with no spare dynamic entry.
    built = build(
        (Elf("bin/program", needs=("dep/libdep.so",), program=True), Elf("dep/libdep.so")), tmp_path / "build"
    )
    libraries = [built["bin/program"]]
    if _lld() is not None:
        top, dep = _top(tmp_path / "lld")
        _with_lld(top, dep)
        libraries.append(top)
    for library in libraries:
        before = library.read_bytes()
        assert not set_rpath_in_place(library, ["/opt/rocm/lib"])
        assert library.read_bytes() == before


def test_a_file_that_is_not_elf_is_left_alone(tmp_path: Path) -> None:
    text = tmp_path / "script.so"
    text.write_text("#!/bin/sh\n")
    assert not set_rpath_in_place(text, ["/opt/rocm/lib"])
    assert text.read_text() == "#!/bin/sh\n"


def _versioned_pair(folder: Path) -> tuple[Path, Path]:
    """``libtop.so`` calling a versioned symbol of ``libdep.so`` (so it has a version need naming it)."""
    folder.mkdir()
    (folder / "dep.c").write_text("int dep(void) { return 1; }\n")
    (folder / "dep.map").write_text("DEP_1 { global: dep; local: *; };\n")
    (folder / "top.c").write_text("int dep(void);\nint top(void) { return dep(); }\n")
    dep, top = folder / "libdep.so", folder / "libtop.so"
    run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            folder / "dep.c",
            "-o",
            dep,
            "-Wl,-soname,libdep.so",
            f"-Wl,--version-script={folder / 'dep.map'}",
        ]
    )
    run(["gcc", "-shared", "-fPIC", folder / "top.c", "-o", top, f"-L{folder}", "-l:libdep.so"])
    return top, dep


def _version_need_files(library: Path) -> list[str]:
    printed = subprocess.run(["readelf", "-V", "-W", library], capture_output=True, text=True, check=True).stdout
    return [line.split("File: ")[1].split()[0] for line in printed.splitlines() if "File: " in line]


def test_a_grafted_library_is_renamed_in_place_as_patchelf_renames_it(tmp_path: Path) -> None:
    # What auditwheel asks when it grafts: the copy gets a new soname, its user needs it by that
    # name (its version needs too: the loader matches them against the library it loaded).
    top, dep = _versioned_pair(tmp_path / "built")
    assert _version_need_files(top) == ["libdep.so"]
    grafted = tmp_path / "libs" / "libdep-0123abcd.so"
    grafted.parent.mkdir()
    shutil.copy(dep, grafted)
    dep.unlink()
    by_patchelf = top.with_name("patchelf.so")
    shutil.copy(top, by_patchelf)
    rename = ["--replace-needed", "libdep.so", grafted.name, "--force-rpath", "--set-rpath", str(grafted.parent)]
    subprocess.run([_patchelf(), *rename, by_patchelf], check=True)
    assert not _loads(top)

    assert edit_in_place(grafted, soname=grafted.name)
    assert edit_in_place(top, needed={"libdep.so": grafted.name}, rpath=[str(grafted.parent)])

    info, expected = read_elf(top, with_fatbin=False), read_elf(by_patchelf, with_fatbin=False)
    assert (info.needed, info.rpath, info.runpath) == (expected.needed, expected.rpath, expected.runpath)
    assert grafted.name in info.needed
    assert _version_need_files(top) == _version_need_files(by_patchelf) == [grafted.name]
    assert read_elf(grafted, with_fatbin=False).soname == grafted.name
    _assert_sound_headers(top)
    _assert_sound_headers(grafted)
    assert _loads(top)
    # A library the file does not need is not renamed: the file is left as it is, for patchelf.
    before = top.read_bytes()
    assert not edit_in_place(top, needed={"libnothere.so": "libnothere-0123abcd.so"})
    assert top.read_bytes() == before


def test_libraries_of_this_machine_keep_working_with_a_needed_library_renamed(tmp_path: Path) -> None:
    # Renamed to itself under a longer name that a link in the same folder resolves: the loader
    # must still find, and version-check, every library by its new name.
    libraries = _system_libraries(12)
    if not libraries:
        pytest.skip("no shared libraries found in this machine's library folder")
    renamed = 0
    for original in libraries:
        library = tmp_path / original.name
        shutil.copy(original, library)
        needed = read_elf(library, with_fatbin=False).needed
        if not needed:
            continue
        # The C library cannot be loaded under two names: rename the first other need.
        name = next((name for name in needed if not name.startswith(("libc.so", "ld-linux"))), None)
        if name is None:
            continue
        alias = tmp_path / f"renamed-{name}"
        found = next(Path("/usr/lib").rglob(name), None) or next(Path("/lib").rglob(name), None)
        if found is None:
            continue
        if not alias.is_symlink():  # two libraries may need the same one
            alias.symlink_to(found)
        if not edit_in_place(library, needed={name: alias.name}, rpath=[str(tmp_path)]):
            continue  # left to patchelf
        _assert_sound_headers(library)
        assert alias.name in read_elf(library, with_fatbin=False).needed, original
        assert name not in _version_need_files(library), original
        assert _loads(library), original
        renamed += 1
    assert renamed, "no library of this machine was renamed in place"
