"""The floor writer: raw copies of unchanged members, parallel chunked deflate, ZIP64 records.

Archives are read back by zipfile and by Info-ZIP's ``unzip -t``, two independent readers."""

from __future__ import annotations

import os
import random
import shutil
import struct
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipeline.errors import RocwheelsError
from pipeline.util.cmd import run
from pipeline.wheel import zipwrite
from pipeline.wheel.archive import check_wheel, read_wheel
from pipeline.wheel.zipwrite import _BEHIND_FROM, CHUNK, Added, extract_members, record_rows, write_wheel

DIST_INFO = "demo-1.0.dist-info"
# Several deflate chunks with a tail, half random (barely compressible) and half repetitive.
BIG = random.Random(11).randbytes(CHUNK + CHUNK // 3) + b"rocm " * (CHUNK // 5)


@pytest.fixture
def wheel(platform_wheel: Callable[..., Path], tmp_path: Path) -> Path:
    return platform_wheel(
        tmp_path / "in",
        "demo",
        {
            "demo/__init__.py": b"X = 1\n",
            "demo/_ext.so": b"\x7fELF fake" * 1000,
            "demo/data.bin": BIG,
        },
    )


def _unzip_test(path: Path) -> str:
    if not shutil.which("unzip"):
        pytest.skip("unzip is not installed (make system-deps installs it)")
    return run(["unzip", "-t", path]).output


def _raw_member(path: Path, name: str) -> bytes:
    """A member's local header, name, extra field and compressed data, as stored."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(name)
    with path.open("rb") as data:
        data.seek(info.header_offset)
        header = data.read(30)
        length = 30 + sum(struct.unpack("<HH", header[26:30])) + info.compress_size
        data.seek(info.header_offset)
        return data.read(length)


def test_unchanged_members_are_copied_as_their_compressed_bytes(wheel: Path, tmp_path: Path) -> None:
    dest = write_wheel(
        wheel,
        tmp_path / "out" / wheel.name,
        record=f"{DIST_INFO}/RECORD",
        changed={"demo/_ext.so": b"\x7fELF patched"},
        threads=2,
    )
    for name in ("demo/__init__.py", "demo/data.bin", f"{DIST_INFO}/METADATA"):
        assert _raw_member(dest, name) == _raw_member(wheel, name)
    check_wheel(dest, verify_hashes=True)  # RECORD rows: reused for copies, new for the patched member
    assert zipfile.ZipFile(dest).read("demo/_ext.so") == b"\x7fELF patched"


@pytest.mark.parametrize("threads", [1, 3])
def test_a_large_member_deflated_in_chunks_is_one_valid_stream(wheel: Path, tmp_path: Path, threads: int) -> None:
    changed = tmp_path / "data.bin"
    changed.write_bytes(BIG[::-1])
    dest = write_wheel(
        wheel,
        tmp_path / "out" / wheel.name,
        record=f"{DIST_INFO}/RECORD",
        changed={"demo/data.bin": changed},
        threads=threads,
    )
    with zipfile.ZipFile(dest) as archive:
        assert archive.read("demo/data.bin") == BIG[::-1]  # zipfile checks the CRC too
        assert archive.getinfo("demo/data.bin").compress_size < len(BIG)
    check_wheel(dest, verify_hashes=True)
    assert "No errors detected" in _unzip_test(dest)


def test_a_large_member_is_hashed_beside_its_inflating_and_still_checked(
    platform_wheel: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    large = random.Random(3).randbytes(_BEHIND_FROM * 3 // 4) + b"rocm " * (_BEHIND_FROM // 16)
    assert len(large) >= _BEHIND_FROM
    wheel = platform_wheel(tmp_path / "in", "demo", {"demo/large.so": large})
    with zipfile.ZipFile(wheel) as archive:
        record = record_rows(archive, f"{DIST_INFO}/RECORD")
    threaded: list[bool] = []  # whether each inflating hashed beside it
    one_behind = zipwrite._one_behind

    def spying(beside: bool) -> object:
        threaded.append(beside)
        return one_behind(beside)

    monkeypatch.setattr(zipwrite, "_one_behind", spying)
    files = extract_members(wheel, ["demo/large.so"], tmp_path / "tree", record=record, threads=2)
    assert threaded == [True]
    assert files["demo/large.so"].read_bytes() == large
    path, _, size = record["demo/large.so"]
    wrong = {**record, "demo/large.so": (path, "sha256=" + "A" * 43, size)}
    with pytest.raises(RocwheelsError, match="does not match its RECORD hash"):
        extract_members(wheel, ["demo/large.so"], tmp_path / "again", record=wrong, threads=2)


def test_forced_zip64_records_read_back(wheel: Path, tmp_path: Path) -> None:
    library = tmp_path / "libgrafted.so"
    library.write_bytes(b"\x7fELF grafted")
    dest = write_wheel(
        wheel,
        tmp_path / "out" / wheel.name,
        record=f"{DIST_INFO}/RECORD",
        changed={"demo/__init__.py": b"X = 2\n"},
        added={"demo.libs/libgrafted.so": Added(library, 0o755)},
        force_zip64=True,
    )
    raw = dest.read_bytes()
    assert raw.count(struct.pack("<I", 0x06064B50)) == 1 and raw.count(struct.pack("<I", 0x07064B50)) == 1
    with zipfile.ZipFile(dest) as archive:
        for info in archive.infolist():
            # every central entry carries a ZIP64 extra field (id 1) with its sizes and offset
            assert struct.unpack_from("<H", info.extra)[0] == 1, info.filename
        assert archive.read("demo/__init__.py") == b"X = 2\n"
        assert archive.read("demo/data.bin") == BIG
        assert (archive.getinfo("demo.libs/libgrafted.so").external_attr >> 16) & 0o777 == 0o755
        assert archive.testzip() is None
    check_wheel(dest, verify_hashes=True)
    assert "No errors detected" in _unzip_test(dest)


def test_a_failed_write_leaves_nothing(wheel: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="not members"):
        write_wheel(wheel, out / wheel.name, record=f"{DIST_INFO}/RECORD", changed={"demo/absent.py": b""})
    assert os.listdir(out) == []


def test_read_wheel_hands_each_selected_member_to_its_work_once_and_removes_it(
    platform_wheel: Callable[..., Path], tmp_path: Path
) -> None:
    members = {"demo/b.so": b"\x7fELF b", "demo/a.py": b"print()", "demo/c.so": b"\x7fELF c" * 1000}
    wheel = platform_wheel(tmp_path, "demo", members)
    seen: list[Path] = []

    def work(name: str, file: Path) -> bytes:
        seen.append(file)
        return file.read_bytes()

    info, read = read_wheel(wheel, lambda head: head.startswith(b"\x7fELF"), work)
    assert info.name == "demo"
    with zipfile.ZipFile(wheel) as archive:
        in_archive = [n for n in archive.namelist() if n.endswith(".so")]
    assert list(read) == in_archive  # archive order, whichever thread finished first
    assert read == {name: members[name] for name in in_archive}
    assert len(seen) == 2 and not any(file.exists() for file in seen)


def test_a_changed_member_is_reported_before_the_work_on_another_fails(
    platform_wheel: Callable[..., Path], tmp_path: Path
) -> None:
    wheel = platform_wheel(tmp_path / "in", "demo", {"demo/a.so": b"\x7fELF", "demo/b.py": b"x = 1\n"})
    tampered = tmp_path / "out" / wheel.name
    tampered.parent.mkdir()
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(tampered, "w", zipfile.ZIP_DEFLATED) as out:
        for info in source.infolist():
            out.writestr(info, b"x = 2\n" if info.filename == "demo/b.py" else source.read(info))

    def work(name: str, file: Path) -> None:
        raise ValueError("the work fails")

    with pytest.raises(ValueError, match="the work fails"):
        read_wheel(wheel, lambda head: True, work)
    with pytest.raises(RocwheelsError, match=r"demo/b\.py does not match its RECORD hash"):
        read_wheel(tampered, lambda head: True, work)


def test_a_member_is_inflated_in_bounded_pieces_whatever_its_ratio(
    platform_wheel: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    zeros = bytes(64 << 20)  # deflates about 1000 to 1: one compressed read would inflate to megabytes
    wheel = platform_wheel(tmp_path, "demo", {"demo/zeros.so": zeros})
    monkeypatch.setenv("ROCWHEELS_MAX_RATIO", "2000")
    largest: list[int] = []
    keep = zipwrite._inflated

    def watched(*args: object) -> Iterator[bytes]:
        for piece in keep(*args):  # type: ignore[arg-type]
            largest.append(len(piece))
            yield piece

    monkeypatch.setattr(zipwrite, "_inflated", watched)
    _, read = read_wheel(wheel, lambda head: head == bytes(len(head)), lambda name, file: file.stat().st_size)
    assert read == {"demo/zeros.so": len(zeros)}
    assert max(largest) <= zipwrite._STEP
