"""The loader's search order as analyze models it (the real loader checks it in test_loader.py), and
the wheel checks that go with an analysis."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from pipeline.errors import RocwheelsError
from pipeline.wheel.analyze import GLIBC_LOADER, MUSL_LOADER, Libc, analyze_wheel, libc_of, system_libraries
from pipeline.wheel.elf import ELF_MAGIC, ElfError, ElfInfo


def elf(*, rpath: tuple[str, ...] = (), runpath: tuple[str, ...] = (), needed: tuple[str, ...] = ()) -> ElfInfo:
    return ElfInfo(
        machine="EM_X86_64",
        soname=None,
        needed=needed,
        rpath=rpath,
        runpath=runpath,
        hip_fatbin=None,
        amdgpu_processor=None,
    )


def test_glibc_inherits_rpath_down_the_chain_until_a_runpath():
    chain = [
        ("pkg/lib/libb.so", elf()),
        ("pkg/lib/liba.so", elf(rpath=("$ORIGIN/../x",))),
        ("pkg/_ext.so", elf(rpath=("$ORIGIN/lib",))),
    ]
    assert GLIBC_LOADER.search_folders(chain) == ["pkg/x", "pkg/lib"]
    # The loading object's own DT_RUNPATH: no DT_RPATH of anyone, then its RUNPATH.
    with_runpath = [("pkg/lib/libb.so", elf(runpath=("$ORIGIN",))), *chain[1:]]
    assert GLIBC_LOADER.search_folders(with_runpath) == ["pkg/lib"]
    # An ancestor with DT_RUNPATH has no DT_RPATH (it is ignored), but those above it still count.
    middle = [chain[0], ("pkg/lib/liba.so", elf(runpath=("$ORIGIN/../y",))), chain[2]]
    assert GLIBC_LOADER.search_folders(middle) == ["pkg/lib"]


def test_musl_inherits_runpath_too():
    chain = [("pkg/lib/libb.so", elf()), ("pkg/bin/tool", elf(runpath=("$ORIGIN/../lib",)))]
    assert MUSL_LOADER.search_folders(chain) == ["pkg/lib"]
    assert GLIBC_LOADER.search_folders(chain) == []


def test_musl_is_recognised_and_its_libc_is_a_system_library():
    assert libc_of([elf(needed=("libc.musl-x86_64.so.1",))]) is Libc.MUSL
    assert libc_of([elf(needed=("libc.so",))]) is Libc.MUSL  # musl-gcc outside Alpine
    assert libc_of([elf(needed=("libc.so.6",))]) is Libc.GLIBC
    assert {"libc.musl-x86_64.so.1", "libc.so"} <= system_libraries(Libc.MUSL)
    assert {"libc.so.6", "libm.so.6"} <= system_libraries(Libc.GLIBC)


# --- the wheel's RECORD is checked beside the analysis ------------------------------------------


def _replace_member(wheel: Path, dest: Path, member: str, data: bytes) -> Path:
    dest.mkdir()
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(dest / wheel.name, "w") as out:
        for info in source.infolist():
            out.writestr(info, data if info.filename == member else source.read(info))
    return dest / wheel.name


def test_a_member_changed_after_the_build_is_reported_before_the_damage_it_does(platform_wheel, tmp_path):
    wheel = platform_wheel(tmp_path, "alpha", {"alpha/_x.so": ELF_MAGIC + bytes(60)})
    with pytest.raises(ElfError, match="not a readable ELF file"):  # damaged as built: the ELF error
        analyze_wheel(wheel)
    tampered = _replace_member(wheel, tmp_path / "tampered", "alpha/_x.so", ELF_MAGIC + b"\xff" * 60)
    with pytest.raises(RocwheelsError, match=re.escape("alpha/_x.so does not match its RECORD hash")):
        analyze_wheel(tampered)
