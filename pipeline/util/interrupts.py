"""One policy for SIGINT and SIGTERM: unwind, clean up, exit 130 or 143.

Ctrl-C (SIGINT) and a CI cancel or timeout (SIGTERM) are treated alike: the first one raises
:class:`~pipeline.errors.Interrupted` in the main thread, so every ``finally`` and ``except
BaseException`` on the way out removes what it was writing (partial wheels, index generations,
downloads). Temporary files of rocwheels and of the tools it runs (auditwheel unpacks a whole
wheel into TMPDIR) go into one private folder that is removed on the way out, whatever left it
there. Further signals during that cleanup are ignored so it can finish. A run killed with
SIGKILL cannot clean up: its folder stays locked (``flock``) only while its process lives, and the
next run removes such folders of dead runs, never one whose run is still going.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.errors import Interrupted
from pipeline.util.files import raise_write_error

log = logging.getLogger("rocwheels")

SIGNALS = (signal.SIGINT, signal.SIGTERM)
PRIVATE_PREFIX = "rocwheels-run-"
# In each private folder: locked by its run for the run's lifetime (the kernel drops the lock when
# the process dies, in whatever way), so a folder whose lock can be taken is a dead run's.
OWNER_LOCK = ".owner.lock"


def _claim(private: Path) -> int:
    """Lock ``private`` as this run's; the descriptor stays open (not inherited by commands) until released."""
    descriptor = os.open(private / OWNER_LOCK, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    return descriptor


def remove_dead_runs(parent: Path) -> list[Path]:
    """Remove the private folders under ``parent`` of runs that no longer live (killed with SIGKILL)."""
    removed = []
    for folder in parent.glob(PRIVATE_PREFIX + "*"):
        try:
            descriptor = os.open(folder / OWNER_LOCK, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:  # no lock file: not a folder of this kind, or another user's; left alone
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its run still holds it
            continue
        else:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(descriptor)
    if removed:
        log.info("removed temporary folders of interrupted runs: %s", ", ".join(str(f) for f in removed))
    return removed


def _interrupt(signum: int, _frame: object) -> None:
    for handled in SIGNALS:
        signal.signal(handled, signal.SIG_IGN)
    raise Interrupted(signum)


@contextmanager
def held_while() -> Iterator[None]:
    """Run the body with SIGINT/SIGTERM held back; the first that arrived is delivered when it ends.

    For starting a child process: a signal raised inside ``Popen`` (or a process pool's start)
    would orphan the child, delivered after it the caller's cleanup knows what to stop. Delivered
    to whatever handler was in place (Interrupted under :func:`interruptible`). Only the main
    thread receives Python's signals, so elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {signum: signal.signal(signum, lambda arrived, _frame: held.append(arrived)) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held:
            signal.raise_signal(held[0])  # also over the body's own failure: the signal decides the exit


@contextmanager
def interruptible() -> Iterator[Path]:
    """For one command's lifetime (main thread): signals unwind; TMPDIR is a private folder, removed at the end."""
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    # Held back until the cleanup below is in place: a signal in between would leave the folder.
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    parent = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):  # an unreadable TMPDIR is reported by mkdtemp just below
        remove_dead_runs(parent)
    try:
        private = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX, dir=parent))
        try:
            owner = _claim(private)
        except BaseException:
            shutil.rmtree(private, ignore_errors=True)
            raise
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        raise_write_error(exc, parent / f"{PRIVATE_PREFIX}*")
    saved_env, saved_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    # Children inherit TMPDIR from the environment; this process's tempfile reads tempfile.tempdir.
    os.environ["TMPDIR"] = tempfile.tempdir = str(private)
    for signum in SIGNALS:
        signal.signal(signum, _interrupt)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        yield private
    finally:
        for signum in SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        shutil.rmtree(private, ignore_errors=True)
        os.close(owner)
        tempfile.tempdir = saved_tempdir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        for signum, handler in previous.items():
            signal.signal(signum, handler)
