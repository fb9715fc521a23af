"""Run one command in a fresh process; write its wall time and peak memory as JSON.

    python measure.py RESULT.json LOG [--timeout SECONDS] -- COMMAND...

run.py starts this wrapper once per measurement because ``getrusage(RUSAGE_CHILDREN)`` reports
the largest peak RSS of *all* children a process has ever waited for: a fresh wrapper has only the
measured command (and the processes it waited for: auditwheel, patchelf) as children. Two numbers:

- ``maxrss_mb``: the kernel's peak RSS of the largest single process of the tree (exact);
- ``tree_peak_mb``: the largest sum of RSS over the whole tree, sampled every 20 ms from /proc
  (a parent idling while its auditwheel child works still holds its memory; short spikes and
  processes living under 20 ms can be missed, and shared pages count once per process).

With ``--timeout``, the command (in a session of its own) and every process of its session are
killed at the limit and ``timed_out`` is true: its figures are then those up to the limit.

Standard library only, so it adds nothing to what it measures.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time

SAMPLE_SECONDS = 0.02
PAGE = os.sysconf("SC_PAGE_SIZE")


class TreeSampler(threading.Thread):
    """Samples the summed RSS of ``pid`` and all its descendants until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.peak = max(self.peak, sum(_rss(pid) for pid in _tree(self.pid)))
            self.stopped.wait(SAMPLE_SECONDS)

    def stop(self) -> None:
        self.stopped.set()
        self.join()


def _tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    todo.extend(int(child) for child in children.read().split())
        except OSError:  # gone since it was listed
            continue
    return found


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def main(argv: list[str]) -> int:
    timeout = float(argv[3]) if len(argv) > 4 and argv[2] == "--timeout" else None
    rest = argv[4:] if timeout is not None else argv[2:]
    if len(argv) < 4 or len(rest) < 2 or rest[0] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    result, log, command = argv[0], argv[1], rest[1:]
    timed_out = False
    with open(log, "wb") as sink:
        started = time.perf_counter()
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=timeout is not None,  # so that its whole tree can be stopped
        )
        sampler = TreeSampler(process.pid)
        sampler.start()
        try:
            returncode = process.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(process.pid, signal.SIGKILL)
            returncode = process.wait()
        seconds = time.perf_counter() - started
        sampler.stop()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(result, "w") as out:
        json.dump(
            {
                "returncode": returncode,
                "timed_out": timed_out,
                "seconds": seconds,
                "maxrss_mb": usage.ru_maxrss / 1024,  # ru_maxrss is in KiB on Linux
                "tree_peak_mb": sampler.peak / (1 << 20),
                "user_s": usage.ru_utime,
                "sys_s": usage.ru_stime,
            },
            out,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
