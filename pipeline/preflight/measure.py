"""``python -m pipeline.preflight.measure RESULT LOG LIMIT -- COMMAND...``: one compile, measured alone.

A fresh process per unit, so the peak memory is the compiler's own: ``ru_maxrss`` of a process is
never lower than the one it was forked from (Linux keeps it across exec), and this one is small.
The command runs in its own process group, so a compiler past LIMIT seconds is stopped with every
process it started (hipcc runs clang, clang runs lld), and so is it when this process is stopped
(SIGTERM from rocwheels, SIGINT from the terminal). Only the standard library: it starts in
milliseconds. The result is a JSON file; the compiler's output goes to LOG.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from types import FrameType

_compiler: subprocess.Popen[bytes] | None = None


def _stop_group() -> None:
    if _compiler is not None:
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(_compiler.pid, signal.SIGKILL)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _stop_group()
    if _compiler is not None:
        with contextlib.suppress(ChildProcessError):  # reaped already
            os.waitpid(_compiler.pid, 0)
    os._exit(128 + signum)


def measure(result: str, log: str, limit: float, command: list[str]) -> int:
    global _compiler
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _on_signal)
    started = time.monotonic()
    stopped = False
    # Its own process group: the time limit stops the compiler and its children, never rocwheels.
    with open(log, "wb") as sink:
        try:
            _compiler = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, process_group=0
            )
        except OSError as exc:  # no such compiler: said in the log as a shell would say it
            sink.write(f"error: cannot run {command[0]}: {exc.strerror}\n".encode())
            _write(result, returncode=127, seconds=0.0, peak_rss_bytes=0, stopped=False)
            return 0
    try:
        returncode = _compiler.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        stopped = True
        _stop_group()
        returncode = _compiler.wait()
    seconds = time.monotonic() - started
    _stop_group()  # a child the compiler left behind
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    _write(result, returncode=returncode, seconds=seconds, peak_rss_bytes=peak_kib * 1024, stopped=stopped)
    return 0


def _write(result: str, **fields: object) -> None:
    with open(result, "w", encoding="utf-8") as sink:
        json.dump(fields, sink)


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    result, log, limit = argv[0], argv[1], float(argv[2])
    return measure(result, log, limit, argv[4:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
