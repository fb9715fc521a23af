"""Shared by the signing, admission and upload tests: a signed project, and the real entry point run in-process."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from pipeline.cli import main
from tests.helpers.recipes import recipe_toml

LOCK = """default_line = "rocm9.9"
[lines."rocm9.9"]
rocm = "9.9.0"
builder_image = "registry.example/rocm/dev@sha256:{zeros}"
image_source = "https://example.org/digests"
python = ["3.11"]
targets = ["gfx90a", "gfx942"]
[lines."rocm9.9".versions]
alpha = "1.0"
""".replace("{zeros}", "0" * 64)


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
