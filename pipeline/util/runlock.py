"""One rocwheels run at a time per wheelhouse: the second waits for the first, saying so.

Two runs writing one wheelhouse (two ``make wheels``, or ``make wheels`` and ``index build``)
could index a wheel that is being replaced or swap index generations under each other. Holding
the lock also makes every temporary name in the wheelhouse (``.*.partial``, index generations
that ``simple`` does not point at) a leftover of a killed run: they are removed on taking and on
releasing it, so an interrupted run never blocks or confuses the next one.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from pipeline.errors import RocwheelsError
from pipeline.util.files import PARTIAL_SUFFIX

log = logging.getLogger("rocwheels")

LOCK_NAME = ".rocwheels.lock"
GENERATION_PREFIX = ".simple-"  # index generations (pipeline/publish/index.py)
INDEX_LINK = "simple"


@contextmanager
def wheelhouse_lock(wheelhouse: Path) -> Iterator[None]:
    """Hold ``wheelhouse``'s lock; wait, with a message, while another run holds it."""
    try:
        wheelhouse.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RocwheelsError(
            f"cannot create the wheelhouse {wheelhouse}: {exc.strerror}",
            fix="choose a writable folder (--wheelhouse or ROCWHEELS_WHEELHOUSE)",
        ) from None
    lock = FileLock(wheelhouse / LOCK_NAME)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.warning("waiting for another rocwheels run using %s to finish (lock: %s)", wheelhouse, lock.lock_file)
        lock.acquire()
    try:
        remove_leftovers(wheelhouse)
        yield
    finally:
        try:
            remove_leftovers(wheelhouse)
        finally:
            lock.release()


def remove_leftovers(wheelhouse: Path) -> list[Path]:
    """Remove the temporary names of interrupted runs (call only while holding the lock)."""
    link = wheelhouse / INDEX_LINK
    current = link.resolve() if link.is_symlink() else None
    removed = []
    for path in wheelhouse.iterdir():
        name = path.name
        if not name.startswith("."):
            continue
        if (name.endswith(PARTIAL_SUFFIX) and not path.is_dir()) or (
            name.startswith(GENERATION_PREFIX) and path.is_symlink()
        ):
            path.unlink(missing_ok=True)
        elif name.startswith(GENERATION_PREFIX) and path.is_dir() and path.resolve() != current:
            shutil.rmtree(path, ignore_errors=True)
        else:
            continue
        removed.append(path)
    if removed:
        log.info("removed leftovers of an interrupted run: %s", ", ".join(p.name for p in removed))
    return removed
