"""A recipe's build environment, one way for a build and for its preflight: a venv, then pip
installs in a fixed order (:func:`installs_for`), each logged to the recipe's log."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from pipeline.description import BuildDescription
from pipeline.util.cmd import run
from pipeline.util.log import RecipeLogger


def installs_for(
    step: BuildDescription,
    *,
    constraints: str | None,
    build_wheels: Sequence[str],
    find_links: Sequence[str],
    dependencies: Sequence[tuple[str, str]],
    tools: Sequence[str] = (),
) -> list[list[str]]:
    """The build environment's pip installs (the arguments after ``pip install``): the line's
    hashed constraints first, which what follows must then satisfy; the recipe's build wheels; a
    `wheels` line's ROCm; then its build requirements, the ``dependencies`` (pinned, from
    ``find_links``) and ``tools`` (a build adds pypa/build) in one install."""
    installs: list[list[str]] = []
    if constraints:
        installs.append(["--require-hashes", "--no-deps", "-r", constraints])
    if build_wheels:
        # No bytecode: a throwaway venv, and compiling torch's thousands of modules is most of an install's time.
        installs.append(["--no-compile", *build_wheels])
    if step.rocm_wheels:
        installs.append(["--extra-index-url", step.rocm_wheels.index_url, *step.rocm_wheels.build])
    pins = [f"{name}=={version}" for name, version in dependencies]
    wanted = [*tools, *step.recipe.build.requires, *pins]
    if wanted:
        installs.append([*(arg for folder in find_links for arg in ("--find-links", folder)), *wanted])
    return installs


def make_environment(
    python: str, venv: Path, installs: Sequence[Sequence[str]], *, log_file: Path, logger: RecipeLogger
) -> Path:
    """A fresh venv made by ``python`` at ``venv``, with ``installs`` (:func:`installs_for`) made in order."""
    run([python, "-m", "venv", venv], log_file=log_file, logger=logger)
    pip: list[str | os.PathLike[str]] = [venv / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check"]
    for args in installs:
        run([*pip, "-q", *args], log_file=log_file, logger=logger)
    return venv
