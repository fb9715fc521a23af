"""Atomic writes and file hashing (pipeline/util/files.py)."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest

from pipeline.util.files import atomic_write, file_sha256


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
