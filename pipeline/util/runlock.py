"""One rocwheels run at a time per wheelhouse: the second waits for the first, saying so.

Two runs writing one wheelhouse (two ``make wheels``, or ``make wheels`` and ``index build``)
could index a wheel that is being replaced or swap index generations under each other. Holding
the lock also makes the temporary names rocwheels wrote there leftovers of a killed run: they are
removed on taking and on releasing it, so an interrupted run never blocks or confuses the next one.
Only names rocwheels made are touched: each carries ``rocwheels-<pid>`` (``atomic_write``'s
pending files, :func:`generation_prefix`), and one whose process still lives is kept. A user's own
``.notes.partial`` or ``.simple-old`` in the same folder survives.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from pipeline.errors import RocwheelsError
from pipeline.util.files import PARTIAL_SUFFIX, RUN_MARK, raise_write_error, run_mark

log = logging.getLogger("rocwheels")

LOCK_NAME = ".rocwheels.lock"
GENERATION_PREFIX = ".simple-"  # index generations (pipeline/publish/index.py)
INDEX_LINK = "simple"
_OUR_PARTIAL = re.compile(rf"^\..+\.{RUN_MARK}-(?P<pid>\d+)(?:-\w+)?{re.escape(PARTIAL_SUFFIX)}$")
_OUR_GENERATION = re.compile(rf"^{re.escape(GENERATION_PREFIX)}{RUN_MARK}-(?P<pid>\d+)-\w+(?P<link>\.link)?$")


def generation_prefix() -> str:
    """``mkdtemp``'s prefix for a new index generation in the wheelhouse."""
    return f"{GENERATION_PREFIX}{run_mark()}-"


def _written_by_a_live_run(pid: int) -> bool:
    """Whether another process ``pid`` still runs (this process's own names are leftovers here)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


@contextmanager
def wheelhouse_lock(
    wheelhouse: Path, *, what: str = "wheelhouse", option: str = "--wheelhouse or ROCWHEELS_WHEELHOUSE"
) -> Iterator[None]:
    """Hold ``wheelhouse``'s lock; wait, with a message, while another run holds it.

    Also taken on the work folder by the commands that build (``what``/``option`` name it in
    messages): two runs with one work folder would empty each other's build folders.
    """
    try:
        wheelhouse.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RocwheelsError(
            f"cannot create the {what} {wheelhouse}: {exc.strerror}",
            fix=f"choose a writable folder ({option})",
        ) from None
    lock = FileLock(wheelhouse / LOCK_NAME)
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            log.warning("waiting for another rocwheels run using %s to finish (lock: %s)", wheelhouse, lock.lock_file)
            lock.acquire()
    except OSError as exc:  # a read-only or full folder
        raise_write_error(exc, wheelhouse / LOCK_NAME)
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
    removed: list[Path] = []
    if not wheelhouse.is_dir():  # removed by the user meanwhile: nothing of ours is left there
        return removed
    for path in wheelhouse.iterdir():
        ours = _OUR_PARTIAL.match(path.name) or _OUR_GENERATION.match(path.name)
        if not ours or _written_by_a_live_run(int(ours["pid"])):
            continue
        if path.is_symlink() or (path.is_file() and path.name.endswith(PARTIAL_SUFFIX)):
            path.unlink(missing_ok=True)
        elif path.is_dir() and not ours.groupdict().get("link") and path.resolve() != current:
            shutil.rmtree(path, ignore_errors=True)
        else:
            continue
        removed.append(path)
    if removed:
        log.info("removed leftovers of an interrupted run: %s", ", ".join(p.name for p in removed))
    return removed
