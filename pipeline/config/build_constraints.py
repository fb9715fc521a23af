"""The lock of the build environments: per line, every recipe's build requirements resolved once.

``recipes/constraints/<line>.txt`` holds the line's build requirements (pypa/build and each
recipe's ``requires`` at the version the line pins) resolved for all of the line's Pythons, each
with its sha256 hashes (``uv pip compile --generate-hashes --universal``). Every build of the line
installs exactly that file, hash-checked (``pip install --require-hashes --no-deps -r``), locally
and in the builder container. The file's first line records a digest of what it was resolved
from, so a changed recipe or line makes it stale, and ``lock check`` says how to refresh it.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from pipeline.config.lock import LockFile
from pipeline.config.recipes import LOCK_FILE, RecipeFile
from pipeline.errors import ConfigError, RocwheelsError
from pipeline.util.cmd import run, uv_binary
from pipeline.util.files import atomic_write

FOLDER = "constraints"
_HEADER = "# rocwheels-inputs: sha256="
# What every build environment holds besides the recipe's own requirements: the build frontend.
FRONTEND = "build"


def constraints_path(recipes_dir: Path, line_name: str) -> Path:
    return recipes_dir / FOLDER / f"{line_name}.txt"


def refresh_command(line_name: str) -> str:
    return f"rocwheels lock constraints --rocm {line_name}"


def line_requirements(recipes: dict[str, RecipeFile], lock_file: LockFile, line_name: str) -> list[str]:
    """The build requirements of every recipe the line pins, at the pinned versions."""
    line = lock_file.line(line_name)
    wanted = {FRONTEND}
    for name, version in line.versions.items():
        recipe = recipes[name].at(version, lock_file.path.parent)
        wanted.update(recipe.build.requires)
    return sorted(wanted)


def _input_digest(requirements: list[str], pythons: tuple[str, ...]) -> str:
    data = json.dumps({"requirements": requirements, "python": sorted(pythons)}, sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()


def compile_constraints(recipes: dict[str, RecipeFile], lock_file: LockFile, line_name: str) -> Path:
    """Resolve the line's build requirements with hashes into its constraints file (all at once)."""
    line = lock_file.line(line_name)
    requirements = line_requirements(recipes, lock_file, line_name)
    target = constraints_path(lock_file.path.parent, line_name)
    target.parent.mkdir(parents=True, exist_ok=True)
    lowest = min(line.python, key=lambda version: tuple(map(int, version.split("."))))
    with tempfile.TemporaryDirectory(prefix=".constraints-", dir=target.parent) as scratch:
        inputs = Path(scratch) / "requirements.in"
        inputs.write_text("\n".join(requirements) + "\n")
        resolved = Path(scratch) / "resolved.txt"
        run(
            [
                _uv(),
                "pip",
                "compile",
                "--quiet",
                "--no-header",
                "--no-annotate",
                "--generate-hashes",
                "--universal",
                "--python-version",
                lowest,
                inputs,
                "-o",
                resolved,
            ]
        )
        text = (
            f"{_HEADER}{_input_digest(requirements, line.python)}\n"
            f"# The build environments of line {line_name} (Python {', '.join(line.python)}): installed with\n"
            f"# pip install --require-hashes --no-deps -r. Refresh: {refresh_command(line_name)}\n"
            + resolved.read_text()
        )
        with atomic_write(target, mode=0o644) as partial:
            partial.write(text.encode())
    return target


def check_constraints(recipes: dict[str, RecipeFile], lock_file: LockFile, line_name: str) -> Path:
    """The line's constraints file; a missing or stale one is an error naming the refresh command."""
    path = constraints_path(lock_file.path.parent, line_name)
    field = f"lines.{line_name}"
    if not path.is_file():
        raise ConfigError(
            lock_file.path.parent / LOCK_FILE,
            field,
            f"has no build-environment lock ({path})",
            fix=f"run: {refresh_command(line_name)}  (resolves the line's build requirements with hashes)",
        )
    expected = _input_digest(line_requirements(recipes, lock_file, line_name), lock_file.line(line_name).python)
    first = path.read_text(encoding="utf-8").partition("\n")[0]
    if first != f"{_HEADER}{expected}":
        raise ConfigError(
            lock_file.path.parent / LOCK_FILE,
            field,
            f"{path} is stale: the line's recipes or Pythons changed since it was resolved",
            fix=f"run: {refresh_command(line_name)}  (and commit the new file)",
        )
    return path


def _uv() -> str:
    binary = uv_binary()
    if binary is None:
        raise RocwheelsError(
            "uv is not installed (rocwheels resolves build environments with it)", fix="pip install uv"
        )
    return binary
