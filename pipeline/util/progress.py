"""Progress for long steps: a live line on a terminal, a heartbeat in plain logs.

A torch build runs for hours with its output going to the recipe's log file; the user still
needs to see that it is alive and roughly where it is.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from pipeline.util.log import AnyLogger

HEARTBEAT_SECONDS = 60.0


@contextmanager
def long_step(label: str, logger: AnyLogger) -> Iterator[Callable[[str], None]]:
    """Yield an ``on_output`` callback that shows the latest output line under ``label``."""
    if sys.stderr.isatty():
        columns = (
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[last]}"),
        )
        with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task(label, last="")
            yield lambda line: progress.update(task, last=line.strip()[-80:])
        return
    started = last_beat = time.monotonic()

    def heartbeat(line: str) -> None:
        nonlocal last_beat
        now = time.monotonic()
        if now - last_beat >= HEARTBEAT_SECONDS:
            last_beat = now
            logger.info("%s: still running after %.0f min: %s", label, (now - started) / 60, line.strip()[-100:])

    yield heartbeat
