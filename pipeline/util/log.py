"""Logging: plain lines on stderr, each recipe's lines prefixed with its name."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

LOGGER = "rocwheels"
# One recipe's logger (recipe_logger); code that logs for the run or for one recipe takes either.
RecipeLogger = logging.LoggerAdapter[logging.Logger]
AnyLogger = logging.Logger | RecipeLogger


def setup_logging(verbose: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger(LOGGER)
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    root.propagate = False


class _Prefixed(RecipeLogger):
    def __init__(self, logger: logging.Logger, prefix: str) -> None:
        super().__init__(logger)
        self.prefix = prefix

    def process(self, msg: object, kwargs: MutableMapping[str, Any]) -> tuple[str, MutableMapping[str, Any]]:
        return f"{self.prefix}: {msg}", kwargs


def recipe_logger(name: str) -> RecipeLogger:
    """A logger whose lines start with ``name:`` so interleaved output stays attributable."""
    return _Prefixed(logging.getLogger(LOGGER), name)
