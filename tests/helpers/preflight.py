"""What the preflight tests share: the command line run on a recipes folder, a compiler that hangs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.helpers import REPO, ROCWHEELS

# Stands in for a compiler that never ends: records its PID and its child's, then waits for it.
SLOW_COMPILER = """#!/bin/sh
echo $$ >> "$SLOW_COMPILER_PIDS"
sleep 300 &
echo $! >> "$SLOW_COMPILER_PIDS"
wait
"""


def recipes_with_compiler(dest: Path, script: str) -> Path:
    """The project's recipes copied to ``dest``, the canary's units compiled by ``script`` (kept in its source)."""
    shutil.copytree(REPO / "recipes", dest)
    compiler = dest / "rocm-canary" / "compiler"
    compiler.write_text(script)
    compiler.chmod(0o755)
    recipe = dest / "rocm-canary.toml"
    recipe.write_text(recipe.read_text().replace('compiler = "hipcc"', 'compiler = "./compiler"'))
    return dest


def start_preflight(
    tmp: Path, recipes: Path, line: str, target: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``rocwheels wheels --preflight`` of the canary on this host started, in its own session (its
    process group stands for a terminal's: SIGINT to it is a Ctrl-C)."""
    argv = [
        *ROCWHEELS,
        "--recipes-dir",
        str(recipes),
        "--wheelhouse",
        str(tmp / "wheelhouse"),
        "--work-dir",
        str(tmp / "work"),
        "wheels",
        "--preflight",
        "--driver",
        "local",
        "--rocm",
        line,
        "--arch",
        target,
        "--recipes",
        "rocm-canary",
        *args,
    ]
    full_env = {**os.environ, "HIP_PLATFORM": "amd", "ROCWHEELS_CACHE": str(tmp / "cache"), **(env or {})}
    return subprocess.Popen(
        argv, env=full_env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def rocwheels_preflight(
    tmp: Path, recipes: Path, line: str, target: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """:func:`start_preflight`, run to its end."""
    process = start_preflight(tmp, recipes, line, target, *args, env=env)
    out, err = process.communicate(timeout=600)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent to reap it does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
