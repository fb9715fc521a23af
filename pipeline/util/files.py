"""Writing a file so that readers see the old bytes or the new ones, never half; a file's sha256;
files shared by hard links, and made one's own again before an edit."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, NoReturn

from pipeline.errors import RocwheelsError

# The temporary name's suffix, and the mark of the run that writes it: the wheelhouse lock removes
# ``.*.rocwheels-<pid>-*.partial`` files a killed run left, never another ``.partial`` file.
PARTIAL_SUFFIX = ".partial"
RUN_MARK = "rocwheels"


def run_mark() -> str:
    """What every temporary name this process writes carries: ``rocwheels-<pid>``."""
    return f"{RUN_MARK}-{os.getpid()}"


def partial_path(target: Path) -> Path:
    """The hidden name beside ``target`` of a whole file this run is about to rename to ``target``
    (``.<name>.rocwheels-<pid>.partial``: the wheelhouse lock removes it if the run is killed)."""
    return target.with_name(f".{target.name}.{run_mark()}{PARTIAL_SUFFIX}")


@contextmanager
def atomic_write(target: Path, *, mode: int | None = None, sync: bool = False) -> Iterator[io.BufferedRandom]:
    """A file to write ``target``'s new bytes into, renamed over ``target`` when the block ends.

    The file is ``.<name>.rocwheels-<pid>-XXXX.partial`` in ``target``'s folder (a rename within one file system is
    atomic; the dot hides it from index listings). An exception, or an interruption, in the block
    removes it and leaves ``target`` as it was. ``mode`` is set before the first byte is written
    (None: as a new file gets it, 0o666 less the umask); ``sync`` flushes the bytes to disk before
    the rename, for a file too costly to lose to a crash right after.
    """
    try:
        handle, name = tempfile.mkstemp(
            dir=target.parent, prefix=f".{target.name}.{run_mark()}-", suffix=PARTIAL_SUFFIX
        )
    except OSError as exc:
        raise_write_error(exc, target)
    temp = Path(name)
    try:
        os.fchmod(handle, mode if mode is not None else 0o666 & ~_umask())
        with os.fdopen(handle, "w+b") as stream:
            yield stream
            if sync:
                stream.flush()
                os.fsync(stream.fileno())
        os.replace(temp, target)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise_write_error(exc, target)
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


# Errors that say where a file was to be written, not what it held: a full, read-only or
# forbidden folder. Each becomes one message naming the file and what to do.
_WHY = {
    errno.ENOSPC: "no space left on its disk",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file is larger than its file system allows",
    errno.EROFS: "it is on a read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOTDIR: "a part of its path is a file, not a folder",
}


def write_error(exc: OSError, target: Path | str | None) -> RocwheelsError | None:
    """A RocwheelsError for a failed write of ``target`` (or the file the error names), if
    ``exc`` is about the place (full, read-only, forbidden) rather than something else."""
    why = _WHY.get(exc.errno or 0)
    if why is None:
        return None
    where = exc.filename or target or "a file"
    return RocwheelsError(
        f"cannot write {where}: {why}",
        fix="free space there or make it writable, or point rocwheels elsewhere "
        "(--wheelhouse, --work-dir, -w for repair, TMPDIR, ROCWHEELS_CACHE)",
    )


def raise_write_error(exc: OSError, target: Path) -> NoReturn:
    """Raise :func:`write_error`'s error for ``exc``, or ``exc`` itself when it is not about the place."""
    error = write_error(exc, target)
    if error is None:
        raise exc
    raise error from None


@contextmanager
def writes_into(place: Path) -> Iterator[None]:
    """A full, read-only or forbidden ``place`` in the block becomes :func:`write_error`'s message."""
    try:
        yield
    except OSError as exc:
        raise_write_error(exc, place)


def link_files(files: Mapping[str, Path], dest: Path) -> None:
    """Each file of ``files`` (relative name -> file) under folder ``dest`` by that name: a hard link
    (no bytes copied), or a copy where the file system has none or ``dest`` is on another.
    ``dest`` is made even for no files: a wheel without ELF members is still a folder to judge."""
    dest.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        target = dest.joinpath(*name.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
            shutil.copy2(source, target)


def unshare(path: Path) -> None:
    """``path`` made a file of its own when hard links share it (:func:`link_files`): an edit of it
    in place then reaches no other name. Its bytes and permissions are kept."""
    if path.stat().st_nlink > 1:
        own = partial_path(path)
        shutil.copy2(path, own)
        os.replace(own, path)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
