"""Waiting for what another process or thread does, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.request import urlopen

import pytest


def wait_for(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` until it is true; fail the test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.02)


def answers(url: str) -> bool:
    """The server at ``url`` answers it with success (not an error status, a refused or a dropped connection)."""
    try:
        with urlopen(url, timeout=1):
            return True
    except OSError:
        return False
