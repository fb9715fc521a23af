"""Wheel archive checks and rewrites, on small real wheels."""

from __future__ import annotations

import os
import re
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.errors import RocwheelsError
from pipeline.wheel.archive import (
    check_wheel,
    extract,
    open_wheel,
    replace_platform_tag,
    rewrite_wheel,
)

PLAT = f"linux_{os.uname().machine}"
DIST_INFO = "demo-1.0.dist-info"
META = {
    f"{DIST_INFO}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-" + PLAT.encode() + b"\n",
    f"{DIST_INFO}/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
}


@pytest.fixture
def wheel(platform_wheel: Callable[..., Path], tmp_path: Path) -> Path:
    return platform_wheel(tmp_path / "in", "demo", {"demo/__init__.py": b"X = 1\n", "demo/_ext.so": b"\x7fELF fake"})


@pytest.fixture
def named(tmp_path: Path) -> Path:
    return tmp_path / f"demo-1.0-cp311-cp311-{PLAT}.whl"


def test_a_valid_wheel_is_described(wheel: Path) -> None:
    info = check_wheel(wheel, verify_hashes=True)
    assert (info.name, info.version, info.dist_info) == ("demo", "1.0", DIST_INFO)
    assert info.tags[0].endswith(PLAT) and len(info.tags) == 1
    assert info.platform_tags == (PLAT,)
    assert info.root_is_purelib is False


def test_random_bytes_are_not_a_wheel(named: Path) -> None:
    path = named
    path.write_bytes(os.urandom(4096))
    with pytest.raises(RocwheelsError, match="not a readable zip archive") as failure:
        check_wheel(path)
    assert failure.value.fix


def test_a_truncated_wheel_is_reported(wheel: Path) -> None:
    data = wheel.read_bytes()
    wheel.write_bytes(data[: len(data) // 2])  # the central directory is gone
    with pytest.raises(RocwheelsError, match="not a readable zip archive"):
        check_wheel(wheel)


def test_damaged_member_data_is_found_when_hashes_are_verified(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo("demo/__init__.py")
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data = bytearray(wheel.read_bytes())
    data[start] ^= 0xFF
    wheel.write_bytes(bytes(data))
    check_wheel(wheel, verify_hashes=False)  # the structure is intact
    with pytest.raises(RocwheelsError, match=r"is damaged|does not match its RECORD"):
        check_wheel(wheel)  # every stage verifies hashes by default


@pytest.mark.parametrize("name", ["../escape.py", "demo/../../escape.py", "/etc/cron.d/x", "C:/x.py", "demo\\..\\x.py"])
def test_unsafe_member_paths_are_refused(name: str, raw_zip: Callable[..., Path], named: Path) -> None:
    path = raw_zip(named, {name: b"", **META, f"{DIST_INFO}/RECORD": b""})
    with pytest.raises(RocwheelsError, match="unsafe member path"):
        check_wheel(path)


def test_an_empty_member_name_is_refused(named: Path) -> None:
    # A central directory entry whose name has no bytes (found by tests/test_fuzz.py): zipfile lists
    # it, and asking it whether the entry is a folder raised IndexError.
    entry = b"PK\x01\x02" + bytes(42)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(entry), 0, 0)
    named.write_bytes(entry + end)
    with pytest.raises(RocwheelsError, match="member path is empty"):
        check_wheel(named)


def test_unsafe_record_paths_are_refused(raw_zip: Callable[..., Path], named: Path) -> None:
    path = raw_zip(named, {**META, f"{DIST_INFO}/RECORD": b"../../etc/passwd,,\n"})
    with pytest.raises(RocwheelsError, match="unsafe RECORD path"):
        check_wheel(path)


@pytest.mark.parametrize(
    ("record", "error"),
    [
        (
            b"\r\x00",
            "line 2 does not have 3 fields",
        ),  # a lone carriage return ends a line (found by tests/test_fuzz.py)
        (b"demo/x.py," + b"a" * 200_000 + b",1\n", "line 1 is not CSV"),  # past the csv module's field limit
    ],
)
def test_a_malformed_record_is_reported_by_line(
    record: bytes, error: str, raw_zip: Callable[..., Path], named: Path
) -> None:
    path = raw_zip(named, {**META, f"{DIST_INFO}/RECORD": record})
    with pytest.raises(RocwheelsError, match=f"RECORD {error}"):
        check_wheel(path)


def test_a_wheel_without_dist_info_is_refused(raw_zip: Callable[..., Path], named: Path) -> None:
    path = raw_zip(named, {"demo/__init__.py": b""})
    with pytest.raises(RocwheelsError, match=r"exactly one top-level \.dist-info folder; found none"):
        check_wheel(path)


def test_two_dist_info_folders_are_refused(raw_zip: Callable[..., Path], named: Path) -> None:
    path = raw_zip(named, {**META, f"{DIST_INFO}/RECORD": b"", "other-2.0.dist-info/METADATA": b""})
    with pytest.raises(RocwheelsError, match=re.escape("found demo-1.0.dist-info, other-2.0.dist-info")):
        check_wheel(path)


def test_record_naming_a_missing_dist_info_is_refused(raw_zip: Callable[..., Path], named: Path) -> None:
    # The case that crashes auditwheel with FileNotFoundError.
    record = f"demo-2.0.dist-info/WHEEL,,\ndemo-2.0.dist-info/METADATA,,\n{DIST_INFO}/RECORD,,\n".encode()
    path = raw_zip(named, {**META, f"{DIST_INFO}/RECORD": record})
    with pytest.raises(
        RocwheelsError,
        match=re.escape("RECORD names the folder demo-2.0.dist-info, but the wheel's is demo-1.0.dist-info"),
    ):
        check_wheel(path)


def test_files_missing_from_record_are_refused(raw_zip: Callable[..., Path], named: Path) -> None:
    record = f"{DIST_INFO}/WHEEL,,\n{DIST_INFO}/METADATA,,\n{DIST_INFO}/RECORD,,\n".encode()
    path = raw_zip(named, {**META, "demo/_hidden.so": b"\x7fELF", f"{DIST_INFO}/RECORD": record})
    with pytest.raises(RocwheelsError, match=re.escape("files missing from RECORD: demo/_hidden.so")):
        check_wheel(path)


@pytest.mark.parametrize("missing", ["WHEEL", "METADATA", "RECORD"])
def test_required_dist_info_files(missing: str, raw_zip: Callable[..., Path], named: Path) -> None:
    members = {**META, f"{DIST_INFO}/RECORD": f"{DIST_INFO}/WHEEL,,\n{DIST_INFO}/METADATA,,\n".encode()}
    del members[f"{DIST_INFO}/{missing}"]
    if missing != "RECORD":
        members[f"{DIST_INFO}/RECORD"] = f"{DIST_INFO}/{'METADATA' if missing == 'WHEEL' else 'WHEEL'},,\n".encode()
    path = raw_zip(named, members)
    with pytest.raises(RocwheelsError, match=f"{DIST_INFO}/{missing} is missing"):
        check_wheel(path)


def test_dist_info_must_match_the_file_name(platform_wheel: Callable[..., Path], tmp_path: Path) -> None:
    wheel = platform_wheel(tmp_path, "demo", {"demo/__init__.py": b""})
    renamed = wheel.rename(wheel.with_name(wheel.name.replace("demo-1.0", "demo-1.1")))
    with pytest.raises(RocwheelsError, match="does not match the file name"):
        check_wheel(renamed)


def test_a_stale_record_hash_is_found(tmp_path: Path, wheel: Path) -> None:
    changed = tmp_path / "changed" / wheel.name
    changed.parent.mkdir()
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(changed, "w") as out:
        for info in source.infolist():
            data = b"X = 2\n" if info.filename == "demo/__init__.py" else source.read(info)
            out.writestr(info, data)
    check_wheel(changed, verify_hashes=False)
    with pytest.raises(RocwheelsError, match=re.escape("demo/__init__.py does not match its RECORD hash")):
        check_wheel(changed)  # every stage verifies hashes by default


def test_open_wheel_reports_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RocwheelsError, match="no such wheel"):
        with open_wheel(tmp_path / "absent.whl"):
            pass


def test_rewrite_replaces_members_and_records_them(wheel: Path, tmp_path: Path) -> None:
    patched = tmp_path / "patched.so"
    patched.write_bytes(b"\x7fELF patched")
    dest = tmp_path / "out" / wheel.name
    rewrite_wheel(wheel, dest, replace={"demo/__init__.py": b"X = 3\n", "demo/_ext.so": patched}, compression_level=1)
    check_wheel(dest, verify_hashes=True)
    with zipfile.ZipFile(wheel) as before, zipfile.ZipFile(dest) as after:
        assert after.read("demo/__init__.py") == b"X = 3\n"
        assert after.read("demo/_ext.so") == b"\x7fELF patched"
        assert after.namelist()[-1] == f"{DIST_INFO}/RECORD"
        for old in before.infolist():
            new = after.getinfo(old.filename)
            assert (new.date_time, new.external_attr) == (old.date_time, old.external_attr)
    assert sorted(p.name for p in dest.parent.iterdir()) == [wheel.name]
    assert dest.stat().st_mode & 0o777 == 0o666 & ~_current_umask()  # readable by the index and web server


def test_rewrite_drops_record_signatures(platform_wheel: Callable[..., Path], tmp_path: Path) -> None:
    wheel = platform_wheel(tmp_path / "in", "demo", {"demo/__init__.py": b"", f"{DIST_INFO}/RECORD.jws": b"{}"})
    dest = rewrite_wheel(wheel, tmp_path / "out" / wheel.name)
    assert f"{DIST_INFO}/RECORD.jws" not in zipfile.ZipFile(dest).namelist()
    check_wheel(dest, verify_hashes=True)


def test_a_failed_rewrite_leaves_nothing(wheel: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="not members"):
        rewrite_wheel(wheel, out / wheel.name, replace={"demo/new.py": b""})
    assert list(out.iterdir()) == []


def test_rewrite_overwrites_an_older_copy_atomically(wheel: Path, tmp_path: Path) -> None:
    dest = tmp_path / "out" / wheel.name
    dest.parent.mkdir()
    dest.write_bytes(b"old")
    rewrite_wheel(wheel, dest)
    assert check_wheel(dest).name == "demo"


def test_extract_keeps_permissions(wheel: Path, tmp_path: Path) -> None:
    with open_wheel(wheel) as archive:
        files = extract(archive, ["demo/_ext.so", "demo/__init__.py"], tmp_path / "x")
    assert files["demo/_ext.so"].read_bytes() == b"\x7fELF fake"
    assert files["demo/_ext.so"].stat().st_mode & 0o777 == 0o755
    assert files["demo/__init__.py"].stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("demo-1.0-cp311-cp311-linux_x86_64.whl", "demo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"),
        (
            "demo-1.0-1-cp311-cp311-manylinux2014_x86_64.manylinux_2_28_x86_64.whl",
            "demo-1.0-1-cp311-cp311-manylinux_2_28_x86_64.whl",
        ),
    ],
)
def test_replace_platform_tag(name: str, expected: str) -> None:
    assert replace_platform_tag(name, "manylinux_2_28_x86_64") == expected


def _current_umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
