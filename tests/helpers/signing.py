"""Shared by the signing, admission and upload tests: a signed project, and the real entry point run in-process."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from pipeline.cli import main
from tests.helpers.recipes import recipe_toml, rocm99_lock_toml

LOCK = rocm99_lock_toml({"alpha": "1.0"})


def signed_project(root: Path, public_keys: list[str]) -> Path:
    """A recipes folder (one recipe, one line) whose lock trusts ``public_keys``; returns it."""
    recipes = root / "recipes"
    recipes.mkdir(parents=True)
    (recipes / "alpha.toml").write_text(recipe_toml("alpha", "1.0"))
    (recipes / "lock.toml").write_text(LOCK + f"[signing]\npublic_keys = {json.dumps(public_keys)}\n")
    return recipes


def trust_keys(recipes: Path, public_keys: list[str]) -> None:
    """Give an existing lock a ``[signing]`` table trusting ``public_keys``."""
    lock = recipes / "lock.toml"
    lock.write_text(lock.read_text() + f"\n[signing]\npublic_keys = {json.dumps(public_keys)}\n")


def rocwheels(capsys, *args: str) -> tuple[int, str]:
    """Run the real entry point; (exit status, stdout + stderr)."""
    old_argv = sys.argv
    sys.argv = ["rocwheels", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.argv = old_argv
    out = capsys.readouterr()
    return code, out.out + out.err


def no_stale_log_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry point binds rocwheels' log to the stderr of its run; an earlier test's capture is
    closed by now, and a line logged before the next run (a server starting) must not go there."""
    monkeypatch.setattr(logging.getLogger("rocwheels"), "handlers", [])
