"""The Makefile's venv: the Python floor said in one line, and a venv made again when the interpreter changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def make_stamp(venv: Path, python: str) -> subprocess.CompletedProcess[str]:
    """Only the interpreter check and stamp (``$(VENV)/.python-id``): the full venv target installs the project."""
    return subprocess.run(
        ["make", "-C", str(REPO), f"VENV={venv}", f"PYTHON={python}", f"{venv}/.python-id"],
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_too_old_python_gets_one_clear_line(tmp_path: Path) -> None:
    old = tmp_path / "python3.10"
    old.write_text('#!/bin/sh\ncase "$1" in -V) echo "Python 3.10.12";; *) exit 1;; esac\n')
    old.chmod(0o755)
    result = make_stamp(tmp_path / "venv", str(old))
    assert result.returncode == 2
    assert f"rocwheels needs Python 3.11 or newer; '{old}' is Python 3.10.12" in result.stdout
    assert "No matching distribution" not in result.stdout + result.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.skipif(not Path("/usr/bin/python3").is_file(), reason="needs a second interpreter at /usr/bin/python3")
def test_the_venv_is_made_again_when_the_interpreter_changes(tmp_path: Path) -> None:
    first = "/usr/bin/python3"
    second = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if os.path.realpath(first) == second:
        pytest.skip("the test's Python is /usr/bin/python3 itself")
    venv = tmp_path / "venv"
    assert make_stamp(venv, first).returncode == 0
    (venv / "made-by-the-first").write_text("")
    again = make_stamp(venv, first)
    assert again.returncode == 0 and (venv / "made-by-the-first").exists(), "same interpreter: the venv stays"
    switched = make_stamp(venv, second)
    assert switched.returncode == 0, switched.stderr
    assert "was made by another Python" in switched.stdout
    assert not (venv / "made-by-the-first").exists()
    assert second in (venv / ".python-id").read_text()
