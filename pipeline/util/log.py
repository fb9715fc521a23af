"""Logging: plain lines on stderr, each recipe's lines prefixed with its name."""

from __future__ import annotations

import logging
import sys

LOGGER = "rocwheels"


def setup_logging(verbose: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger(LOGGER)
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    root.propagate = False


class _Prefixed(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        return f"{self.extra['prefix']}: {msg}", kwargs


def recipe_logger(name: str) -> logging.LoggerAdapter:
    """A logger whose lines start with ``name:`` so interleaved output stays attributable."""
    return _Prefixed(logging.getLogger(LOGGER), {"prefix": name})
