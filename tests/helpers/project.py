"""A small project for tests that run the real command line: two recipes, a lock line, and its
wheelhouse, work folder, cache and TMPDIR, all under one folder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pytest

from tests.helpers.recipes import recipe_toml, rocm99_lock_toml
from tests.helpers.wheels import write_wheel

LOCK = rocm99_lock_toml({"alpha": "1.0", "beta": "1.0"})


class Held(Protocol):
    """What a project holds during its run and closes after it: a socket, a mount."""

    def close(self) -> None: ...


@dataclass
class Project:
    """The folders of one small project under ``root``."""

    root: Path
    keep: list[Held] = field(default_factory=list)  # sockets and the like held open during the run

    @property
    def recipes(self) -> Path:
        return self.root / "recipes"

    @property
    def wheelhouse(self) -> Path:
        return self.root / "wheelhouse"

    @property
    def work(self) -> Path:
        return self.root / "build"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def recipe(self, name: str, text: str | bytes) -> Path:
        path = self.recipes / f"{name}.toml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path

    def wheel(self, version: str = "1.0+rocm9.9", name: str = "alpha", build: str = "ours") -> Path:
        return write_wheel(self.wheelhouse, name, version, build=build)


def small_project(root: Path) -> Project:
    """Recipes alpha and beta (beta needs alpha) on the lock line rocm9.9, and empty cache and TMPDIR folders."""
    project = Project(root)
    project.recipes.mkdir(parents=True)
    project.recipe("alpha", recipe_toml("alpha", "1.0"))
    project.recipe("beta", recipe_toml("beta", "1.0", depends_on=("alpha",)))
    (project.recipes / "lock.toml").write_text(LOCK)
    project.tmp.mkdir()
    project.cache.mkdir()
    return project


def replace_in(name: str, old: str, new: str) -> Callable[[Project], None]:
    def setup(p: Project) -> None:
        path = p.recipes / name
        path.write_text(path.read_text().replace(old, new))

    return setup


def escaping_tar_source(p: Project) -> None:
    """alpha's source: a local .tar.gz whose link member points out of the unpack folder; the
    lock line is this host's ROCm release so a local build gets as far as unpacking."""
    import hashlib
    import tarfile

    from pipeline.build.host import host_rocm_version

    rocm = host_rocm_version()
    if rocm is None:
        pytest.skip("a local build needs a ROCm on this host")
    archive = p.root / "alpha-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        link = tarfile.TarInfo("alpha-1.0/escape")
        link.type, link.linkname = tarfile.SYMTYPE, "../../../../etc/passwd"
        tar.addfile(link)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    replace_in("alpha.toml", 'path = "."', f'url = "file://{archive}"\nsha256 = "{digest}"')(p)
    replace_in("lock.toml", 'rocm = "9.9.0"', f'rocm = "{rocm}"')(p)
    # The line's build-environment lock, as `lock constraints` would head it (nothing is installed:
    # the source is unpacked first).
    from pipeline.config import build_constraints as constraints
    from pipeline.config.lock import load_lock
    from pipeline.config.recipes import load_recipes

    lock = load_lock(p.recipes)
    wanted = constraints.line_requirements(load_recipes(p.recipes), lock, "rocm9.9")
    path = constraints.constraints_path(p.recipes, "rocm9.9")
    path.parent.mkdir()
    path.write_text(f"{constraints._HEADER}{constraints._input_digest(wanted, lock.line('rocm9.9').python)}\n")
