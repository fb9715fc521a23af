"""Two rocwheels runs on one wheelhouse: the second waits, saying so, and both finish intact."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import REPO, ROCWHEELS, index_build_argv
from tests.helpers.wheels import write_wheel


def test_second_run_waits_for_the_first(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    write_wheel(wheelhouse, "alpha", "1.0+rocm9.9")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # The first run: a process holding the wheelhouse lock (as `rocwheels wheels` does while it builds).
    holder = holding_the_lock(wheelhouse, env)
    second = subprocess.Popen(
        index_build_argv(wheelhouse, tmp_path / "none"),
        env=env,
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert second.stderr is not None
    waiting = second.stderr.readline()
    assert "waiting for another rocwheels run using" in waiting and str(wheelhouse) in waiting
    time.sleep(0.5)
    assert second.poll() is None and not (wheelhouse / "simple").exists()  # nothing written while it waits
    release(holder)
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert "alpha==1.0+rocm9.9" in (wheelhouse / "constraints-rocm9.9.txt").read_text()


def test_two_index_builds_at_once_both_succeed(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    for number in range(20):
        write_wheel(wheelhouse, f"pkg{number}", "1.0+rocm9.9")
    argv = index_build_argv(wheelhouse, tmp_path / "none")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = [subprocess.Popen(argv, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for run in runs:
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
    generations = [p for p in wheelhouse.iterdir() if p.name.startswith(".simple-")]
    assert generations == [(wheelhouse / "simple").resolve()]
    assert (wheelhouse / "constraints-rocm9.9.txt").read_text().count("==1.0+rocm9.9") == 20


def test_two_wheels_runs_with_one_work_folder_take_turns(tmp_path: Path) -> None:
    """Two `wheels` runs into different wheelhouses share the work folder (build/): the second waits
    for the first instead of emptying its build folders under it."""
    from tests.helpers.project import escaping_tar_source, small_project

    project = small_project(tmp_path / "project")
    escaping_tar_source(project)  # a recipe whose build stops early (at unpacking), after the lock
    work = tmp_path / "build"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(project.tmp)}
    holder = holding_the_lock(work, env, what="work folder")
    second = subprocess.Popen(
        [
            *ROCWHEELS,
            "--recipes-dir",
            project.recipes,
            "--wheelhouse",
            tmp_path / "other-wheelhouse",
            "--work-dir",
            work,
            "wheels",
            "--driver",
            "local",
            "--arch",
            "gfx90a",
            "--recipes",
            "alpha",
        ],
        env=env,
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert second.stderr is not None
    lines = iter(second.stderr.readline, "")
    waiting = next((line for line in lines if "waiting" in line), "")
    assert "waiting for another rocwheels run using" in waiting and str(work) in waiting
    time.sleep(0.5)
    assert second.poll() is None and not (work / "work").exists()  # nothing touched while it waits
    release(holder)
    _, err = second.communicate(timeout=120)
    assert "Traceback" not in err and "unsafe member" in err, err


def holding_the_lock(folder: Path, env: dict[str, str], what: str = "wheelhouse") -> subprocess.Popen[str]:
    """Another process holding rocwheels' lock on ``folder`` until its stdin is closed."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom pathlib import Path\nfrom pipeline.util.runlock import wheelhouse_lock\n"
            f"with wheelhouse_lock(Path({str(folder)!r}), what={what!r}):\n"
            "    print('locked', flush=True)\n    sys.stdin.readline()\n",
        ],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def release(holder: subprocess.Popen[str]) -> None:
    """Let :func:`holding_the_lock`'s process go; it ends cleanly."""
    holder.communicate("\n", timeout=30)
    assert holder.returncode == 0
