"""The README's commands work as written, after the README's own set-up line.

Every `rocwheels ...` and `make ...` line of the README's command blocks names a command and
options that exist (checked against the command's own `--help`); the lines that can run on this
machine as they stand are run, with the outcome the README promises.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

README = REPO / "README.md"


def command_lines() -> list[str]:
    """The command lines of the README's indented blocks (comments stripped)."""
    lines = []
    for raw in README.read_text(encoding="utf-8").splitlines():
        if not raw.startswith("    "):
            continue
        line = raw.strip().split("  #", 1)[0].strip()
        if line.startswith(("rocwheels ", "make ")):
            lines.append(line)
    return lines


def setup_env() -> dict[str, str]:
    """The environment after the README's set-up line (`export PATH="$PWD/.venv/bin:$PATH"`)."""
    setup = next(line for line in README.read_text().splitlines() if line.strip().startswith("export PATH="))
    value = setup.strip().split("#", 1)[0].strip().removeprefix("export PATH=").strip('"')
    path = value.replace("$PWD", str(REPO)).replace("$PATH", os.environ["PATH"])
    return {**os.environ, "PATH": path}


def run_here(line: str, *, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        shlex.split(line), cwd=cwd, env=setup_env(), capture_output=True, text=True, check=False, timeout=300
    )


def subcommand_and_options(line: str) -> tuple[list[str], list[str]]:
    """(['rocwheels', 'lock', 'pin'], ['--rocm']) for `rocwheels lock pin --rocm LINE`."""
    words = line.replace("[", " ").replace("]", " ").replace("|", " ").split()
    path = [words[0]]
    for word in words[1:]:
        if word.startswith("-") or not re.fullmatch(r"[a-z][a-z-]*", word):
            break
        path.append(word)
    options = [word.split("=", 1)[0] for word in words if re.fullmatch(r"--[a-z][a-z-]*(=.*)?", word)]
    return path, options


def test_the_readme_shows_commands_and_the_set_up_puts_rocwheels_on_path() -> None:
    assert len(command_lines()) >= 20
    result = run_here("rocwheels --help")
    assert result.returncode == 0 and "Commands:" in result.stdout, result.stderr


@pytest.mark.parametrize("line", sorted({line for line in command_lines() if line.startswith("rocwheels ")}))
def test_every_rocwheels_line_names_a_command_and_options_that_exist(line: str) -> None:
    path, options = subcommand_and_options(line)
    while len(path) > 1:
        result = run_here(shlex.join([*path, "--help"]))
        if result.returncode == 0:
            break
        path.pop()  # a word that is a value (`image build|base|test`), not a subcommand
    assert result.returncode == 0, f"{line}: `{' '.join(path)} --help` failed: {result.stderr}"
    missing = [option for option in options if option not in result.stdout]
    assert not missing, f"{line}: {' '.join(path)} has no {', '.join(missing)}"


@pytest.mark.parametrize("line", sorted({line for line in command_lines() if line.startswith("make ")}))
def test_every_make_line_names_a_target_and_variables_the_makefile_has(line: str) -> None:
    makefile = (REPO / "Makefile").read_text()
    words = shlex.split(line)
    target = words[1]
    assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"{line}: no target {target}"
    for word in words[2:]:
        variable = word.split("=", 1)[0]
        assert re.search(rf"\$\({variable}\)", makefile), f"{line}: the Makefile never reads {variable}"


# The lines that run here as written, and what the README says they do.
RUNS_HERE = {
    "rocwheels lock check": (0, "consistent"),
    "rocwheels plan --arch gfx942": (0, "1. rocm-canary"),
    # The default line's registry image is not pinned in the shipped lock: the matrix refuses to fan out.
    "rocwheels ci matrix --format github": (1, "not pinned by digest"),
}


@pytest.mark.parametrize(("line", "outcome"), RUNS_HERE.items())
def test_the_lines_that_run_here_do_what_the_readme_says(line: str, outcome: tuple[int, str]) -> None:
    assert any(shown == line or shown.startswith(line + " [") for shown in command_lines()), (
        f"{line} is no longer in the README: update RUNS_HERE"
    )
    code, text = outcome
    result = run_here(line)
    assert result.returncode == code, result.stderr
    assert text in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
