"""Where rocwheels reads and writes: recipes in, raw builds in a work folder, accepted wheels out."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import InputError


def cache_dir() -> Path:
    """rocwheels' cache: downloads, compiler cache, repair notes (``ROCWHEELS_CACHE`` moves it)."""
    cache = Path(os.environ.get("ROCWHEELS_CACHE", Path.home() / ".cache" / "rocwheels"))
    if cache.exists() and not cache.is_dir():
        raise InputError(
            f"the cache {cache} is a file, not a folder",
            fix="set ROCWHEELS_CACHE to a folder (it is created if missing), or remove that file",
        )
    return cache


def fresh_dir(path: Path) -> Path:
    """``path`` as an empty folder: what an earlier run left there is removed."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


@dataclass(frozen=True)
class Layout:
    recipes_dir: Path
    wheelhouse: Path  # only repaired, verified wheels (and logs/, simple/, constraints) land here
    work_dir: Path  # sources, build venvs, raw and staged wheels: never served

    @property
    def logs(self) -> Path:
        return self.wheelhouse / "logs"

    def log_file(self, recipe: str) -> Path:
        return self.logs / f"{recipe}.log"

    def recipe_work(self, recipe: str) -> Path:
        return self.work_dir / "work" / recipe

    def raw(self, recipe: str) -> Path:
        return self.work_dir / "raw" / recipe

    @property
    def repaired(self) -> Path:
        """Where ``rocwheels repair`` writes without ``-w``: repaired is not verified, so not the wheelhouse."""
        return self.work_dir / "repaired"

    def staging(self, recipe: str) -> Path:
        return self.work_dir / "staging" / recipe
