"""Smoke test: install a wheel into a fresh venv and run its recipe's import check.

GPU checks (``gpu_code``) run only where this host's GPUs are ones the wheel has code for
(:mod:`pipeline.verify.host_gpus`).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from venv import EnvBuilder

from pipeline.config.recipes import Smoke
from pipeline.config.toolchain import python_version
from pipeline.errors import CommandError
from pipeline.util.cmd import run
from pipeline.verify.host_gpus import gpu_check
from pipeline.verify.pip_config import uv_install
from pipeline.wheel.archive import parse_wheel_name, split_variant

log = logging.getLogger("rocwheels")


@dataclass(frozen=True)
class SmokeResult:
    passed: bool
    skipped: bool
    message: str


def interpreter_for(wheel: Path) -> str | None:
    """A Python on this machine that can install the wheel (its cpXY tag), or None."""
    tags = parse_wheel_name(wheel.name)[3]
    versions = {version for tag in tags if (version := python_version(tag.interpreter))}
    if not versions or f"{sys.version_info.major}.{sys.version_info.minor}" in versions:
        return sys.executable
    for version in sorted(versions):
        found = shutil.which(f"python{version}")
        # A pyenv shim is on PATH for every version it knows, and fails for the inactive ones.
        if found and run([found, "-c", ""], check=False, quiet=True).returncode == 0:
            return found
    return None


def smoke_test(
    wheel: Path,
    smoke: Smoke,
    *,
    requirements: Sequence[str] = (),
    find_links: Path | None = None,
    index_urls: Sequence[str] = (),
    checks: Sequence[str] = (),
    code_targets: Iterable[Sequence[str]] | None = None,
    log_file: Path | None = None,
    scratch: Path | None = None,
) -> SmokeResult:
    """Install ``wheel`` (and ``requirements``, found in ``find_links`` or the extra ``index_urls``)
    into a fresh venv, run the recipe's snippets, then ``checks`` (more Python snippets). The GPU
    snippet runs where :func:`gpu_check` says, for ``code_targets`` (the targets of each of the
    wheel's files with GPU code objects; None: its GPU code is compiled as it runs)."""
    gpu = gpu_check(code_targets) if smoke.gpu_code else None
    python = interpreter_for(wheel)
    if python is None:
        return SmokeResult(False, True, f"no Python on this machine matches {wheel.name}; not installed")
    with tempfile.TemporaryDirectory(prefix="rocwheels-smoke-", dir=scratch) as folder:
        work = Path(folder)
        venv_python = work / "venv" / "bin" / "python"
        wheel = _installable(wheel, work)
        links = [option for path in ([find_links] if find_links else []) for option in ("--find-links", str(path))]
        links += [option for url in index_urls for option in ("--extra-index-url", url)]
        try:
            note = _install(python, work, [*links, str(wheel), *requirements], log_file)
            for snippet in (*smoke.snippets(gpu=gpu is not None and gpu.run), *checks):
                run([venv_python, "-c", snippet], log_file=log_file, cwd=work)
        except CommandError as exc:
            return SmokeResult(False, False, f"smoke test failed: {exc.message}")
    gpu_note = gpu.outcome() if gpu is not None else "no GPU check"
    installed = f"installed in a fresh venv{f' ({note})' if note else ''}"
    return SmokeResult(True, False, f"{installed}; {', '.join(smoke.imports)} imported; {gpu_note}")


def _install(python: str, work: Path, arguments: Sequence[str], log_file: Path | None) -> str:
    """Make ``work``/venv with ``python`` and pip-install ``arguments`` into it; returns a note when pip did it.

    uv installs what pip would, in a fraction of pip's start-up time, when pip's settings here all
    have a uv equivalent. pip keeps the last word: where uv is missing or fails to install, pip
    installs into a new venv, so a wheel passes or fails as it did with pip.
    """
    _make_venv(python, work / "venv", log_file)
    uv = uv_install(os.environ)
    if isinstance(uv, str):
        _pip_install(work, arguments, log_file)
        return f"by pip: {uv}"
    # uv's cache goes with the venv (pip keeps no copy of a local wheel either); on the venv's file
    # system, uv hard-links from it rather than copying.
    uv_pip = [uv.binary, "pip", "install", "--quiet", "--no-config", "--cache-dir", str(work / "uv-cache")]
    try:
        run(
            [*uv_pip, "--python", str(work / "venv" / "bin" / "python"), *uv.options, *arguments],
            env=uv.env,
            log_file=log_file,
            cwd=work,
        )
    except (CommandError, OSError) as exc:
        # A new venv for pip: nothing uv half-installed may decide the outcome.
        shutil.rmtree(work / "venv")
        _make_venv(python, work / "venv", log_file)
        _pip_install(work, arguments, log_file)
        output = exc.output.strip() if isinstance(exc, CommandError) else ""
        return f"by pip, after uv failed: {output.splitlines()[-1] if output else str(exc).splitlines()[0]}"
    return ""


def _make_venv(python: str, venv: Path, log_file: Path | None) -> None:
    """A venv without pip (seeding one is most of a venv's cost): made in this process for rocwheels'
    own Python, as ``python -m venv --without-pip`` would, which saves starting an interpreter."""
    if python == sys.executable:
        log.debug("venv.EnvBuilder(symlinks=True).create(%s)", venv)
        EnvBuilder(symlinks=True).create(venv)
    else:
        run([python, "-m", "venv", "--without-pip", venv], log_file=log_file)


def _pip_install(work: Path, arguments: Sequence[str], log_file: Path | None) -> None:
    """rocwheels' own pip installs into the venv (--python), with this machine's pip configuration."""
    # --no-compile: the venv is thrown away, and byte-compiling the torch it installs is slow.
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            work / "venv" / "bin" / "python",
            "install",
            "--disable-pip-version-check",
            "-q",
            "--no-compile",
            *arguments,
        ],
        log_file=log_file,
        cwd=work,
    )


def _installable(wheel: Path, folder: Path) -> Path:
    """``wheel`` under a name pip installs: a variant wheel's bytes under its name without the label
    (no pip reads PEP 825 names yet; its variant.json is one more file of the install)."""
    plain, label = split_variant(wheel.name)
    if label is None:
        return wheel
    target = folder / plain
    try:
        os.link(wheel, target)
    except OSError:  # another file system
        shutil.copyfile(wheel, target)
    return target
