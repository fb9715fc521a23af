"""Atomic writes, file hashing and files shared by hard links (pipeline/util/files.py)."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

import pytest

from pipeline.util.files import atomic_write, file_sha256, link_files, unshare


def test_the_new_bytes_arrive_with_one_rename(tmp_path):
    target = tmp_path / "record.json"
    target.write_bytes(b"old")
    with atomic_write(target) as stream:
        stream.write(b"new")
        assert target.read_bytes() == b"old"  # readers see the old file until the block ends
        (partial,) = [p for p in tmp_path.iterdir() if p != target]
        assert partial.name.startswith(".record.json.") and partial.name.endswith(".partial")
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["record.json"]


def test_a_failure_leaves_the_old_file_and_no_partial(tmp_path):
    target = tmp_path / "record.json"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_write(target, sync=True) as stream:
        stream.write(b"half")
        raise RuntimeError("interrupted")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["record.json"]


@pytest.mark.parametrize("mode", [0o600, 0o644])
def test_mode_as_asked(tmp_path, mode):
    target = tmp_path / "file"
    with atomic_write(target, mode=mode) as stream:
        stream.write(b"x")
    assert stat.S_IMODE(target.stat().st_mode) == mode


def test_mode_of_a_new_file_by_default(tmp_path):
    umask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "file") as stream:
            stream.write(b"x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "file").stat().st_mode) == 0o644


def test_sha256_of_a_path_and_of_an_open_file(tmp_path):
    data = os.urandom(3 << 20)
    path = tmp_path / "data"
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    with atomic_write(tmp_path / "copy") as stream:
        stream.write(data)
        assert file_sha256(stream) == hashlib.sha256(data).hexdigest()


def test_linked_files_share_their_bytes_until_one_is_made_its_own(tmp_path):
    source = tmp_path / "tree" / "lib.so"
    source.parent.mkdir()
    source.write_bytes(b"raw bytes")
    source.chmod(0o755)
    link_files({"pkg/lib.so": source}, tmp_path / "linked")
    linked = tmp_path / "linked" / "pkg" / "lib.so"
    assert linked.stat().st_ino == source.stat().st_ino  # no byte copied
    unshare(source)
    with open(source, "r+b") as file:  # an edit in place, as repair's RPATH editor makes it
        file.write(b"new")
    assert linked.read_bytes() == b"raw bytes" and source.read_bytes() == b"new bytes"
    assert stat.S_IMODE(source.stat().st_mode) == 0o755
    assert sorted(os.listdir(source.parent)) == ["lib.so"]  # no partial left
    unshare(source)  # a file of its own already: left as it is
    assert source.read_bytes() == b"new bytes"


def test_linking_to_another_file_system_copies(tmp_path):
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second file system (/dev/shm) beside the temporary folder")
    source = tmp_path / "lib.so"
    source.write_bytes(b"raw bytes")
    with tempfile.TemporaryDirectory(dir=other) as folder:
        link_files({"a/lib.so": source}, Path(folder))
        copied = Path(folder, "a", "lib.so")
        assert copied.read_bytes() == b"raw bytes" and copied.stat().st_ino != source.stat().st_ino


def test_linking_no_files_makes_the_empty_folder(tmp_path):
    # auditwheel's zip2dir contract: the folder exists after it, whatever the wheel holds.
    link_files({}, tmp_path / "judged" / "alpha.whl")
    assert (tmp_path / "judged" / "alpha.whl").is_dir()
