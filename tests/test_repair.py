"""Repair end to end: real HIP extensions built here (tests/helpers/hip_wheels.py), real auditwheel,
real patchelf."""

from __future__ import annotations

import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.errors import RocwheelsError
from pipeline.repair.policy import LinkPackage, load_policy
from pipeline.repair.repair import RepairSettings, _retag, repair_wheel
from pipeline.util.cmd import run
from pipeline.wheel.archive import check_wheel
from pipeline.wheel.elf import read_elf
from tests.helpers import ROCWHEELS
from tests.helpers.hip_wheels import EXT, LINK, ROCM_LIB_DIR, Built, Repaired, extract_wheel, members


@pytest.mark.hipcc
def test_foreign_library_is_grafted_and_rocm_is_not(repaired: Repaired) -> None:
    names = members(repaired.wheel)
    grafted = [m for m in names if m.startswith("hipext.libs/")]
    assert any(re.fullmatch(r"hipext\.libs/libtestdep-[0-9a-f]{8}\.so\.1", m) for m in grafted), grafted
    policy = load_policy()
    assert not [m for m in names if policy.is_rocm(m)], "a ROCm library was grafted"
    # libfakelink belongs to another package (link_packages): linked, not copied.
    assert not [m for m in names if "fakelink" in m]


@pytest.mark.hipcc
def test_rpaths_point_at_rocm_the_graft_folder_and_linked_packages(repaired: Repaired, tmp_path: Path) -> None:
    site = extract_wheel(repaired.wheel, tmp_path / "site")
    kernel = read_elf(site / f"hipext/_kernel{EXT}")
    linked = read_elf(site / f"hipext/sub/_linked{EXT}")
    # DT_RPATH on purpose (it also serves dependencies of dependencies); no RUNPATH left over.
    assert kernel.runpath == () and linked.runpath == ()
    assert kernel.rpath == ("$ORIGIN/../hipext.libs", ROCM_LIB_DIR)
    assert linked.rpath == ("$ORIGIN/../../fakepkg/lib", ROCM_LIB_DIR)
    for info in (kernel, linked):
        assert "" not in info.rpath
        assert all(e.startswith("$ORIGIN") or e == ROCM_LIB_DIR for e in info.rpath)


@pytest.mark.hipcc
def test_one_platform_tag_in_name_and_wheel_file(repaired: Repaired) -> None:
    info = check_wheel(repaired.wheel, verify_hashes=True)  # RECORD matches every rewritten member
    assert len(info.platform_tags) == 1
    (tag,) = info.platform_tags
    assert re.fullmatch(r"manylinux_\d+_\d+_\w+", tag), tag
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert info.tags == (f"{python}-{python}-{tag}",)
    assert sorted(repaired.wheelhouse.iterdir()) == [repaired.wheel]  # no temporary file left


@pytest.mark.hipcc
def test_pip_installs_it_and_it_imports_without_ld_library_path(
    repaired: Repaired, built: Built, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    # pip checks the tag against this interpreter and installs by RECORD; no index, no config.
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--isolated",
            "--no-index",
            "--no-deps",
            "--disable-pip-version-check",
            "--target",
            site,
            repaired.wheel,
        ],
        env={"PIP_CONFIG_FILE": os.devnull},
    )
    (site / "fakepkg" / "lib").mkdir(parents=True)
    (site / "fakepkg" / "lib" / "libfakelink.so").write_bytes(built.fakelink.read_bytes())
    code = "import hipext._kernel as k, hipext.sub._linked as l; print(k.value(), l.value())"
    out = run([sys.executable, "-c", code], env={"PYTHONPATH": str(site), "LD_LIBRARY_PATH": ""}, cwd=tmp_path)
    assert out.output.split() == ["41", "7"]


@pytest.mark.hipcc
def test_requested_platform_is_the_only_tag(repaired: Repaired, ld_library_path: None, tmp_path: Path) -> None:
    (found,) = check_wheel(repaired.wheel).platform_tags
    again = repair_wheel(repaired.raw, tmp_path, RepairSettings(link_packages=(LINK,), plat=found))
    assert check_wheel(again).platform_tags == (found,)


def test_too_low_platform_fails_cleanly(built: Built, platform_wheel: Callable[..., Path], tmp_path: Path) -> None:
    raw = platform_wheel(tmp_path / "raw", "recentpkg", {f"recentpkg/_recent{EXT}": built.recent})
    wheelhouse = tmp_path / "wheelhouse"
    with pytest.raises(RocwheelsError, match="newer than the requested platform") as failure:
        repair_wheel(raw, wheelhouse, RepairSettings(plat=f"manylinux_2_17_{os.uname().machine}"))
    assert "plat" in (failure.value.fix or "")
    assert not wheelhouse.exists()


def test_unlocatable_library_names_library_and_file(
    built: Built,
    ld_library_path: None,
    platform_wheel: Callable[..., Path],
    tmp_path: Path,
) -> None:
    raw = platform_wheel(tmp_path / "raw", "brokenpkg", {f"brokenpkg/_missing{EXT}": built.missing})
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    with pytest.raises(RocwheelsError) as failure:
        repair_wheel(raw, wheelhouse)
    message = str(failure.value)
    assert "'libgone.so.1'" in message and f"needed by brokenpkg/_missing{EXT}" in message
    assert "[repair] exclude" in (failure.value.fix or "") and "install it in the builder" in (failure.value.fix or "")
    assert list(wheelhouse.iterdir()) == []


def test_unlocatable_indirect_library_names_the_chain(
    built: Built,
    ld_library_path: None,
    platform_wheel: Callable[..., Path],
    tmp_path: Path,
) -> None:
    raw = platform_wheel(tmp_path / "raw", "brokenpkg", {f"brokenpkg/_indirect{EXT}": built.indirect})
    with pytest.raises(RocwheelsError) as failure:
        repair_wheel(raw, tmp_path / "wheelhouse")
    message = str(failure.value)
    assert "'libgone.so.1'" in message
    assert f"{built.deps / 'libtestmid.so.1'} (pulled in by brokenpkg/_indirect{EXT})" in message
    assert not (tmp_path / "wheelhouse").exists()


def test_excluding_the_unlocatable_library_repairs(
    built: Built,
    ld_library_path: None,
    platform_wheel: Callable[..., Path],
    tmp_path: Path,
) -> None:
    raw = platform_wheel(tmp_path / "raw", "brokenpkg", {f"brokenpkg/_missing{EXT}": built.missing})
    wheel = repair_wheel(
        raw, tmp_path / "wheelhouse", RepairSettings(excludes=("libgone.so*",), extra_rpath=("/opt/gone/lib",))
    )
    site = extract_wheel(wheel, tmp_path / "site")
    # Only an excluded, non-ROCm library is needed: extra_rpath, and no rocm_lib_dir.
    assert read_elf(site / f"brokenpkg/_missing{EXT}").rpath == ("/opt/gone/lib",)


def _broken_wheel(kind: str, folder: Path, raw_zip: Callable[..., Path]) -> Path:
    """A raw wheel damaged the way ``kind`` says; auditwheel would crash or misbehave on each."""
    path = folder / f"bad-1.0-cp311-cp311-linux_{os.uname().machine}.whl"
    if kind == "corrupt zip":
        folder.mkdir(parents=True)
        path.write_bytes(b"PK\x03\x04 this is not a zip archive")
        return path
    return raw_zip(
        path,
        {
            "no dist-info": {"bad/__init__.py": b""},
            "RECORD names another dist-info": {
                "bad/__init__.py": b"",
                "bad-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nTag: cp311-cp311-linux_x86_64\n",
                "bad-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: bad\nVersion: 1.0\n",
                "bad-1.0.dist-info/RECORD": b"bad/__init__.py,,\nbad-2.0.dist-info/WHEEL,,\nbad-2.0.dist-info/METADATA,,\n"
                b"bad-1.0.dist-info/RECORD,,\n",
            },
            "member with ..": {"bad/../../escape.py": b"", "bad-1.0.dist-info/RECORD": b""},
        }[kind],
    )


@pytest.mark.parametrize("kind", ["corrupt zip", "no dist-info", "RECORD names another dist-info", "member with .."])
def test_broken_wheels_fail_before_auditwheel(
    kind: str,
    raw_zip: Callable[..., Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    raw = _broken_wheel(kind, tmp_path / "raw", raw_zip)
    wheelhouse = tmp_path / "wheelhouse"
    with caplog.at_level("INFO", logger="rocwheels"), pytest.raises(RocwheelsError) as failure:
        repair_wheel(raw, wheelhouse)
    assert raw.name in str(failure.value) and failure.value.fix
    assert not [r for r in caplog.records if "auditwheel" in r.getMessage()]
    assert not wheelhouse.exists()


def test_a_platform_wheel_without_compiled_code_is_named(platform_wheel: Callable[..., Path], tmp_path: Path) -> None:
    # No ELF member means an empty folder of links for auditwheel: it once crashed on the missing folder.
    raw = platform_wheel(tmp_path / "raw", "alpha", {"alpha/__init__.py": b"x = 1\n"})
    wheelhouse = tmp_path / "wheelhouse"
    with pytest.raises(RocwheelsError, match="no compiled code") as failure:
        repair_wheel(raw, wheelhouse)
    assert raw.name in str(failure.value) and failure.value.fix
    assert not wheelhouse.exists() or not list(wheelhouse.iterdir())


def test_wheel_file_tags_are_replaced_in_place() -> None:
    text = (
        "Wheel-Version: 1.0\nGenerator: x\nRoot-Is-Purelib: false\nTag: py2-none-linux_x86_64\n"
        "Tag: py3-none-linux_x86_64\nTag: py3-none-manylinux_2_17_x86_64\nBuild: 1\n"
    )
    assert _retag(text, "manylinux_2_28_x86_64") == (
        "Wheel-Version: 1.0\nGenerator: x\nRoot-Is-Purelib: false\nTag: py2-none-manylinux_2_28_x86_64\n"
        "Tag: py3-none-manylinux_2_28_x86_64\nBuild: 1\n"
    )


def test_link_package_entries() -> None:
    assert LinkPackage.parse("torch/lib:libtorch*.so, libc10*.so") == LinkPackage(
        "torch/lib", ("libtorch*.so", "libc10*.so")
    )
    assert LinkPackage.parse("torch/lib:libtorch*.so").provides("libtorch_hip.so")
    for bad in ("torch:torch/lib", "torch/lib", "/usr/lib:libx.so", "../x:libx.so", ":libx.so"):
        with pytest.raises(RocwheelsError, match="link_packages"):
            LinkPackage.parse(bad)


@pytest.mark.parametrize("entry", ["opt/rocm/lib", "", "/opt/rocm/lib:/usr/lib"])
def test_search_paths_must_be_absolute_single_folders(entry: str, tmp_path: Path) -> None:
    with pytest.raises(RocwheelsError, match="search path"):
        RepairSettings(rocm_lib_dir=entry)


def test_settings_reach_the_container_as_a_description_file_and_read_back_equal(tmp_path: Path) -> None:
    import json

    settings = RepairSettings(
        excludes=("libx.so*",), rocm_lib_dir="/usr/lib", link_packages=(LINK,), plat="manylinux_2_28_x86_64"
    )
    settings = settings.extended(excludes=("liby.so*",), requires_pins=("torch==2.14.1+rocm7.2",))
    assert settings.excludes == ("libx.so*", "liby.so*") and settings.links == (LinkPackage.parse(LINK),)
    description = tmp_path / "build-description.json"
    description.write_text(json.dumps({"name": "x", "repair": settings.document()}))
    assert RepairSettings.read(description) == settings
    assert settings.policy().is_excluded("liby.so.1") and settings.policy().is_excluded("libfakelink.so")


def test_a_settings_file_that_is_not_a_description_is_named(tmp_path: Path) -> None:
    for text in ("not json", "[]", '{"repair": {"excludes": []}}'):
        path = tmp_path / "settings.json"
        path.write_text(text)
        with pytest.raises(RocwheelsError, match=str(path)):
            RepairSettings.read(path)


@pytest.mark.hipcc
def test_a_repaired_wheel_repairs_to_a_copy_of_itself(
    repaired: Repaired, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = RepairSettings(link_packages=(LINK,), rocm_lib_dir=ROCM_LIB_DIR)
    # First with an empty cache: auditwheel's verdict and the RPATH rules find nothing to change.
    monkeypatch.setenv("ROCWHEELS_CACHE", str(tmp_path / "cache"))
    judged = repair_wheel(repaired.wheel, tmp_path / "judged", settings, log_file=tmp_path / "judged.log")
    assert "nothing to graft" in (tmp_path / "judged.log").read_text()
    # Then from the note that judgement left: no analysis at all.
    noted = repair_wheel(repaired.wheel, tmp_path / "noted", settings, log_file=tmp_path / "noted.log")
    assert "copied" in (tmp_path / "noted.log").read_text()
    assert judged.read_bytes() == noted.read_bytes() == repaired.wheel.read_bytes()
    # Other settings are another question: judged again.
    other = repair_wheel(
        repaired.wheel,
        tmp_path / "other",
        settings.extended(extra_rpath=("/opt/x/lib",)),
        log_file=tmp_path / "other.log",
    )
    assert "auditwheel verdict" in (tmp_path / "other.log").read_text()
    check_wheel(other, verify_hashes=True)


@pytest.mark.hipcc
def test_the_wheel_repair_wrote_is_copied_unless_changed_in_place(
    repaired: Repaired,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    settings = RepairSettings(link_packages=(LINK,), rocm_lib_dir=ROCM_LIB_DIR)
    monkeypatch.setenv("ROCWHEELS_CACHE", str(tmp_path / "cache"))
    written = repair_wheel(repaired.wheel, tmp_path / "written", settings)
    again = repair_wheel(written, tmp_path / "again", settings, log_file=tmp_path / "again.log")
    assert again.read_bytes() == written.read_bytes()
    assert "copied" in (tmp_path / "again.log").read_text()
    # The same file, one byte in its largest member's data changed in place, its size and times kept.
    before = written.stat()
    with zipfile.ZipFile(written) as archive:
        largest = max(archive.infolist(), key=lambda info: info.compress_size)
    with written.open("r+b") as file:
        file.seek(largest.header_offset + 30 + len(largest.filename.encode()) + largest.compress_size // 2)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    os.utime(written, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = written.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    with pytest.raises(RocwheelsError, match=r"is damaged|does not match its RECORD hash"):
        repair_wheel(written, tmp_path / "out", settings, log_file=tmp_path / "out.log")
    assert not (tmp_path / "out.log").exists()  # no "copied" note: judged, and refused
    assert not list((tmp_path / "out").glob("*"))


def test_a_result_written_on_another_file_system_is_copied_into_the_wheelhouse(
    repaired: Repaired,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # The repaired wheel is written aside in the temporary folder and renamed into the wheelhouse,
    # which another file system refuses: then it is copied.
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second file system (a tmpfs at /dev/shm) here")
    monkeypatch.setattr(tempfile, "tempdir", str(shm))
    monkeypatch.setenv("ROCWHEELS_CACHE", str(tmp_path / "cache"))
    elsewhere = (
        "/opt/rocm-elsewhere/lib"  # new RPATHs, the same tag and nothing to graft: the wheel set aside is the result
    )
    settings = RepairSettings(link_packages=(LINK,), rocm_lib_dir=elsewhere)
    result = repair_wheel(repaired.wheel, tmp_path / "wheelhouse", settings)
    assert result.name == repaired.wheel.name
    check_wheel(result, verify_hashes=True)
    extension = next(path for path in extract_wheel(result, tmp_path / "unpacked").rglob(f"*{EXT}"))
    assert elsewhere in read_elf(extension, with_fatbin=False).rpath
    assert not list(shm.glob("rocwheels-repair-*"))


def test_a_script_without_a_main_guard_gets_the_fix(repaired: Repaired, tmp_path: Path) -> None:
    # The analysis process starts with multiprocessing's spawn, which runs the calling script again.
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from pathlib import Path\nfrom pipeline.repair.repair import repair_wheel\n"
        f"repair_wheel(Path({str(repaired.raw)!r}), Path({str(tmp_path / 'out')!r}))\n"
    )
    env = {**os.environ, "ROCWHEELS_CACHE": str(tmp_path / "cache"), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    result = run([sys.executable, str(script)], env=env, check=False, quiet=True)
    assert result.returncode != 0
    assert "analysis process stopped before it answered" in result.output
    assert 'if __name__ == "__main__":' in result.output
    assert not list((tmp_path / "out").glob("*")) and not list((tmp_path / "tmp").iterdir())


def test_a_changed_copy_of_a_repaired_wheel_is_judged_not_copied(
    repaired: Repaired,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    settings = RepairSettings(link_packages=(LINK,), rocm_lib_dir=ROCM_LIB_DIR)
    monkeypatch.setenv("ROCWHEELS_CACHE", str(tmp_path / "cache"))
    repair_wheel(repaired.wheel, tmp_path / "judged", settings)  # leaves the note for this name
    # Same name and members, a Python file changed after the repair.
    tampered = tmp_path / "tampered" / repaired.wheel.name
    tampered.parent.mkdir()
    with zipfile.ZipFile(repaired.wheel) as source, zipfile.ZipFile(tampered, "w", zipfile.ZIP_DEFLATED) as out:
        for info in source.infolist():
            data = source.read(info)
            out.writestr(info, data + b"# changed\n" if info.filename == "hipext/__init__.py" else data)
    assert members(tampered) == members(repaired.wheel)
    with pytest.raises(RocwheelsError, match=r"hipext/__init__\.py does not match its RECORD hash"):
        repair_wheel(tampered, tmp_path / "out", settings, log_file=tmp_path / "out.log")
    log = tmp_path / "out.log"
    assert "copied" not in (log.read_text() if log.exists() else "")
    assert not list((tmp_path / "out").glob("*"))  # nothing written, not even a partial file


def test_repair_without_a_folder_never_writes_into_the_wheelhouse(
    tmp_path: Path, built: Built, platform_wheel: Callable[..., Path]
) -> None:
    """`rocwheels repair WHEEL` (no -w): the wheelhouse holds verified wheels only; the result goes
    to the work folder's repaired/."""
    raw = platform_wheel(tmp_path / "raw", "recentpkg", {f"recentpkg/_recent{EXT}": built.recent})
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    verified = wheelhouse / raw.name
    verified.write_bytes(b"a verified wheel of the same name")
    env = {**os.environ, "ROCWHEELS_WHEELHOUSE": str(wheelhouse), "ROCWHEELS_WORK_DIR": str(tmp_path / "work")}
    out = run([*ROCWHEELS, "--recipes-dir", "none", "repair", raw], env=env, cwd=tmp_path).output
    (written,) = (tmp_path / "work" / "repaired").glob("recentpkg-*.whl")
    assert str(written) in out
    assert [p.name for p in wheelhouse.iterdir()] == [raw.name]
    assert verified.read_bytes() == b"a verified wheel of the same name"
