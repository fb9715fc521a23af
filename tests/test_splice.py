"""Deflating again only the changed blocks: every splice is read back by zlib and zlib-ng (two
inflaters), the wheels by zipfile and Info-ZIP's ``unzip -t``."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import zipfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zlib_ng import zlib_ng

from pipeline.errors import RocwheelsError
from pipeline.util.cmd import run
from pipeline.wheel import splice
from pipeline.wheel.rpath import set_rpath_in_place
from pipeline.wheel.splice import LIBRARIES, BlockIndex, IndexedInflater, inflate_library, plan_splice
from pipeline.wheel.zipwrite import _data_offset, extract_members, record_hash, record_rows, write_wheel

DIST_INFO = "demo-1.0.dist-info"
NAME = "demo/lib.so"


def _deflated(data: bytes, level: int, strategy: int = zlib.Z_DEFAULT_STRATEGY) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -15, 8, strategy)
    return compressor.compress(data) + compressor.flush()


def _indexed(stream: bytes, library: str = "zlib-ng") -> tuple[bytes, BlockIndex]:
    inflater = IndexedInflater(LIBRARIES[library]())
    # fed in odd pieces: boundaries fall anywhere in them
    output = b"".join(
        piece for at in range(0, len(stream), 7001) for piece in inflater.decompress(stream[at : at + 7001])
    )
    return output, inflater.index()


def _stream_file(folder: Path, stream: bytes) -> Path:
    """``stream`` alone in a file: plan_splice reads the old stream at an offset of it (0 here)."""
    path = folder / "old.deflate"
    path.write_bytes(stream)
    return path


def _spliced(stream: bytes, plan: splice.Splice) -> bytes:
    return b"".join(
        piece if isinstance(piece, bytes) else stream[piece[0] : piece[0] + piece[1]] for piece in plan.pieces
    )


def _data(seed: int, size: int) -> bytes:
    """Compressible, like code: words of a small vocabulary, some random bytes."""
    rng = random.Random(seed)
    words = [rng.randbytes(rng.randrange(1, 12)) for _ in range(200)]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) if rng.random() < 0.9 else rng.randbytes(rng.randrange(1, 300))
    return bytes(out[:size])


ORIGINAL = _data(5, 1_500_000)
STREAMS = {
    "zlib level 1": _deflated(ORIGINAL, 1),
    "zlib level 9": _deflated(ORIGINAL, 9),
    "fixed codes only": _deflated(ORIGINAL, 6, zlib.Z_FIXED),
    "stored blocks": _deflated(ORIGINAL, 0),
    "zlib-ng level 5": zlib_ng.compress(ORIGINAL, 5, -15),
}
INDEXES = {kind: _indexed(stream)[1] for kind, stream in STREAMS.items()}

edits = st.lists(
    st.tuples(st.integers(0, len(ORIGINAL) - 1), st.binary(min_size=1, max_size=64)), min_size=1, max_size=4
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(sorted(STREAMS)),
    changes=edits,
    ending=st.one_of(st.none(), st.binary(min_size=1, max_size=5000), st.integers(0, len(ORIGINAL) - 1)),
)
def test_a_spliced_stream_inflates_to_the_edited_bytes(
    kind: str, changes: list[tuple[int, bytes]], ending: bytes | int | None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("splice")
    stream = STREAMS[kind]
    edited = bytearray(ORIGINAL)
    for at, data in changes:
        edited[at : at + len(data)] = data[: len(edited) - at]
    if isinstance(ending, bytes):
        edited += ending  # what an edit appends (a segment)
    elif isinstance(ending, int):
        del edited[ending:]  # what patchelf may leave shorter
    (folder / "new").write_bytes(edited)
    plan = plan_splice(INDEXES[kind], folder / "new", _stream_file(folder, stream), 0, 5)
    assert plan is not None
    new_stream = _spliced(stream, plan)
    assert zlib.decompress(new_stream, -15) == edited
    assert zlib_ng.decompress(new_stream, -15) == edited
    assert (plan.size, plan.crc, plan.sha256.digest()) == (
        len(edited),
        zlib.crc32(edited),
        hashlib.sha256(edited).digest(),
    )
    assert plan.compressed_size == len(new_stream)


@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_each_inflate_library_indexes_the_same_blocks(library: str) -> None:
    for kind, stream in STREAMS.items():
        output, index = _indexed(stream, library)
        assert output == ORIGINAL
        assert (index.starts, index.bits, index.digests) == (
            INDEXES[kind].starts,
            INDEXES[kind].bits,
            INDEXES[kind].digests,
        ), kind
        assert index.starts[-1] == len(ORIGINAL) and index.bits[-1] == 8 * len(stream)


def test_the_fast_inflate_is_found_here() -> None:
    # zlib-ng's module exports its C API today; when a release hides it, indexing falls back to
    # the system's zlib (at half the speed): this says so.
    assert inflate_library().name == "zlib-ng"


def test_only_blocks_near_a_change_are_deflated_again(tmp_path: Path) -> None:
    stream = STREAMS["zlib level 9"]
    edited = bytearray(ORIGINAL)
    edited[700_000] ^= 0xFF
    (tmp_path / "new").write_bytes(edited)
    plan = plan_splice(INDEXES["zlib level 9"], tmp_path / "new", _stream_file(tmp_path, stream), 0, 5)
    assert plan is not None
    assert plan.redone < 200_000  # the changed block and those up to 32 KiB past it, of 1.5 MB
    kept = sum(piece[1] for piece in plan.pieces if isinstance(piece, tuple))
    assert kept > 0.8 * len(stream)
    assert zlib.decompress(_spliced(stream, plan), -15) == edited


def test_an_unchanged_file_keeps_every_bit(tmp_path: Path) -> None:
    stream = STREAMS["zlib level 1"]
    (tmp_path / "new").write_bytes(ORIGINAL)
    plan = plan_splice(INDEXES["zlib level 1"], tmp_path / "new", _stream_file(tmp_path, stream), 0, 5)
    assert plan is not None and plan.redone == 0
    assert _spliced(stream, plan) == stream


def test_bytes_that_are_not_the_indexed_stream_are_not_spliced(tmp_path: Path) -> None:
    (tmp_path / "new").write_bytes(ORIGINAL)
    other = bytearray(STREAMS["zlib level 9"])
    other[1000] ^= 1  # same size, other bytes
    assert plan_splice(INDEXES["zlib level 9"], tmp_path / "new", _stream_file(tmp_path, bytes(other)), 0, 5) is None


def test_a_file_mostly_changed_is_left_to_a_whole_deflate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(splice, "_LARGEST_REDONE", 64 << 10)
    (tmp_path / "new").write_bytes(os.urandom(100) + ORIGINAL[100:][::-1])
    stream = STREAMS["zlib level 1"]
    assert plan_splice(INDEXES["zlib level 1"], tmp_path / "new", _stream_file(tmp_path, stream), 0, 5) is None


def test_a_damaged_stream_is_named_when_indexed(tmp_path: Path) -> None:
    wheel = _deflated_wheel(tmp_path, ORIGINAL)
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo(NAME)
    data = bytearray(wheel.read_bytes())
    data[info.header_offset + 30 + len(NAME) + 100] ^= 0xFF  # inside the deflate stream
    wheel.write_bytes(data)
    with zipfile.ZipFile(wheel) as archive:
        rows = record_rows(archive, f"{DIST_INFO}/RECORD")
    with pytest.raises(RocwheelsError, match=f"member {NAME} is damaged"):
        extract_members(wheel, [NAME], tmp_path / "tree", record=rows, indexes={})


def _deflated_wheel(folder: Path, library: bytes) -> Path:
    """A wheel holding ``library`` as NAME, deflated by zipfile (another deflate than rocwheels')."""
    path = folder / "demo-1.0-cp311-cp311-linux_x86_64.whl"
    texts = {
        f"{DIST_INFO}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n",
        f"{DIST_INFO}/METADATA": b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
    }
    rows = "".join(f"{name},{record_hash(data)},{len(data)}\n" for name, data in {NAME: library, **texts}.items())
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in {
            NAME: library,
            **texts,
            f"{DIST_INFO}/RECORD": f"{rows}{DIST_INFO}/RECORD,,\n".encode(),
        }.items():
            archive.writestr(name, data)
    return path


def _a_large_library(scratch: Path) -> Path:
    """One of this machine's shared libraries of 2 MB or more whose RPATH is set in place (probed, not named)."""
    for folder in (Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib")):
        for path in sorted(folder.glob("lib*.so*")) if folder.is_dir() else ():
            large = path.is_file() and not path.is_symlink() and path.stat().st_size >= 2 << 20
            if large and set_rpath_in_place(Path(shutil.copy(path, scratch / "probe.so")), ["/opt/x"]):
                return path
    pytest.skip("no shared library of 2 MB or more whose RPATH this machine's editor sets in place")


def test_a_library_with_its_rpath_set_keeps_most_of_its_compressed_bytes(tmp_path: Path) -> None:
    library = _a_large_library(tmp_path).read_bytes()
    wheel = _deflated_wheel(tmp_path, library)
    with zipfile.ZipFile(wheel) as archive:
        rows = record_rows(archive, f"{DIST_INFO}/RECORD")
    indexes: dict[str, BlockIndex] = {}
    tree = extract_members(wheel, [NAME], tmp_path / "tree", record=rows, indexes=indexes)
    assert set(indexes) == {NAME}
    assert set_rpath_in_place(tree[NAME], ["$ORIGIN/../rocm/lib", "/opt/rocm/lib"])
    out = write_wheel(
        wheel, tmp_path / "out" / wheel.name, record=f"{DIST_INFO}/RECORD", changed={NAME: tree[NAME]}, indexes=indexes
    )
    with zipfile.ZipFile(out) as archive:
        assert archive.read(NAME) == tree[NAME].read_bytes()  # CRC checked on the way
        assert record_rows(archive, f"{DIST_INFO}/RECORD")[NAME][1] == record_hash(tree[NAME].read_bytes())
    # What was written: the old bits but near the edits (the program headers, the search path,
    # and whatever the editor appended: a copy of the string table when the new path is longer).
    with zipfile.ZipFile(wheel) as archive, wheel.open("rb") as raw:
        data_offset = _data_offset(raw, archive.getinfo(NAME))
    plan = plan_splice(indexes[NAME], tree[NAME], wheel, data_offset, 6)
    assert plan is not None
    appended = tree[NAME].stat().st_size - len(library)
    assert plan.redone < appended + (1 << 20)
    assert sum(piece[1] for piece in plan.pieces if isinstance(piece, tuple)) > 0.9 * indexes[NAME].compressed_size
    if shutil.which("unzip"):
        assert "No errors detected" in run(["unzip", "-t", out]).output
