"""Writing a file so that readers see the old bytes or the new ones, never half; and a file's sha256."""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

# The temporary name's suffix: the wheelhouse lock removes ``.*.partial`` files a killed run left.
PARTIAL_SUFFIX = ".partial"


@contextmanager
def atomic_write(target: Path, *, mode: int | None = None, sync: bool = False) -> Iterator[io.BufferedRandom]:
    """A file to write ``target``'s new bytes into, renamed over ``target`` when the block ends.

    The file is ``.<name>.XXXX.partial`` in ``target``'s folder (a rename within one file system is
    atomic; the dot hides it from index listings). An exception, or an interruption, in the block
    removes it and leaves ``target`` as it was. ``mode`` is set before the first byte is written
    (None: as a new file gets it, 0o666 less the umask); ``sync`` flushes the bytes to disk before
    the rename, for a file too costly to lose to a crash right after.
    """
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=PARTIAL_SUFFIX)
    temp = Path(name)
    try:
        os.fchmod(handle, mode if mode is not None else 0o666 & ~_umask())
        with os.fdopen(handle, "w+b") as stream:
            yield stream
            if sync:
                stream.flush()
                os.fsync(stream.fileno())
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def file_sha256(file: Path | BinaryIO) -> str:
    """The sha256 of the file at path ``file``, or of the whole of an open file (as
    :func:`atomic_write` gives one, before its rename), read in 1 MiB blocks."""
    if isinstance(file, Path):
        with file.open("rb") as stream:
            return file_sha256(stream)
    file.flush()
    file.seek(0)
    digest = hashlib.sha256()
    for block in iter(lambda: file.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
