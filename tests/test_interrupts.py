"""SIGINT and SIGTERM sent to a real ``rocwheels`` process mid-stage: exit 130/143, nothing left behind,
and the same command succeeds next time without any cleanup.

Each stage is held at a known point by a local server that stalls (a download half sent, an upload
whose answer never comes) or by a file it is writing, so the signal lands while work is under way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipeline.util.cmd import run
from pipeline.util.interrupts import PRIVATE_PREFIX
from tests.helpers import REPO, ROCWHEELS, index_build_argv
from tests.helpers.hip_wheels import EXT, Built
from tests.helpers.project import small_project
from tests.helpers.waiting import wait_for
from tests.helpers.wheels import write_platform_wheel, write_wheel

SIGNALS = pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])


class _Stalling(BaseHTTPRequestHandler):
    """Answers GET of /file with half its bytes then waits; POST (an upload) is read and never answered."""

    started: threading.Event
    release: threading.Event
    body = b"x" * 200_000

    def do_GET(self) -> None:
        if self.path == "/simple/":  # an empty index: every wheel is to be uploaded
            page = b"<html><body></body></html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        if not self.path.startswith("/file"):
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body[: len(self.body) // 2])
        self.wfile.flush()
        self.started.set()
        self.release.wait(30)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.started.set()
        self.release.wait(30)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def stalling_server() -> Iterator[tuple[str, threading.Event]]:
    started, release = threading.Event(), threading.Event()
    handler = type("Handler", (_Stalling,), {"started": started, "release": release})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", started
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def _ignore_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def start(
    args: list[str], tmp: Path, env: dict[str, str] | None = None, *, ignoring_signals: bool = False
) -> subprocess.Popen[str]:
    """``python -m pipeline ARGS`` with TMPDIR and the cache under the test's folder.

    ``ignoring_signals``: SIGINT and SIGTERM ignored until rocwheels sets its own policy, so those
    landing in Python's start-up, before any code of rocwheels runs, change nothing.
    """
    full_env = {**os.environ, "TMPDIR": str(tmp / "tmp"), "ROCWHEELS_CACHE": str(tmp / "cache"), **(env or {})}
    (tmp / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen(
        [*ROCWHEELS, *args],
        env=full_env,
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_signals if ignoring_signals else None,
    )


def stop_and_wait(process: subprocess.Popen[str], stop: signal.Signals) -> tuple[int, str]:
    process.send_signal(stop)
    _, err = process.communicate(timeout=60)
    return process.returncode, err


def leftovers(tmp: Path) -> list[str]:
    found = [p.name for p in (tmp / "tmp").iterdir()]
    for folder in (tmp / "wheelhouse", tmp / "cache", tmp / "out"):
        if folder.exists():
            found += [
                str(p)
                for p in folder.rglob("*")
                if p.name.endswith(".partial") or (p.name.startswith(".simple-") and (folder / "simple").resolve() != p)
            ]
    return found


@pytest.mark.network
@SIGNALS
def test_download_interrupted(tmp_path: Path, stop: signal.Signals) -> None:
    """A signal while a url source is half downloaded: the cache keeps no partial file."""
    script = tmp_path / "download.py"
    with stalling_server() as (url, started):
        script.write_text(
            "import logging, sys\nfrom pathlib import Path\nfrom pipeline.util.interrupts import interruptible\n"
            "from pipeline.build.sources import _download\n"
            "from pipeline.errors import Interrupted\n"
            "try:\n    with interruptible():\n"
            f"        _download({url + 'file.tar.gz'!r}, '0' * 64, Path('r.toml'), 'f', logging.LoggerAdapter(logging.getLogger(), {{}}))\n"
            "except Interrupted as exc:\n    sys.exit(exc.exit_code)\n"
        )
        env = {
            **os.environ,
            "TMPDIR": str(tmp_path / "tmp"),
            "ROCWHEELS_CACHE": str(tmp_path / "cache"),
            "PYTHONPATH": str(REPO),
        }
        (tmp_path / "tmp").mkdir()
        process = subprocess.Popen([sys.executable, script], env=env, stderr=subprocess.PIPE, text=True)
        assert started.wait(30)
        wait_for(lambda: any((tmp_path / "cache" / "sources").glob("*.partial")), "the partial download appears")
        status, err = stop_and_wait(process, stop)
    assert status == 128 + stop, err
    assert leftovers(tmp_path) == []


@pytest.mark.network
@SIGNALS
def test_upload_interrupted_then_published(tmp_path: Path, stop: signal.Signals) -> None:
    """A signal while twine's upload waits for the index: twine stops too, TMPDIR is clean, a rerun works."""
    write_wheel(tmp_path / "wheelhouse", "alpha", "1.0+rocm9.9")
    with stalling_server() as (url, started):
        process = start(
            ["--wheelhouse", "wheelhouse", "publish", "--attempts", "1", "--repository", url],
            tmp_path,
            {"TWINE_USERNAME": "u", "TWINE_PASSWORD": "p"},
        )
        # the index pages answer 404 (nothing there), then twine POSTs and waits
        assert started.wait(60), process.communicate()[1] if process.poll() is not None else ""
        status, err = stop_and_wait(process, stop)
    assert status == 128 + stop, err
    assert "Traceback" not in err and "interrupted by signal" in err
    assert leftovers(tmp_path) == []


def _started(tmp: Path) -> bool:
    """rocwheels has set its signal policy up (its private TMPDIR exists)."""
    return any(p.name.startswith(PRIVATE_PREFIX) for p in (tmp / "tmp").iterdir())


INDEX_POINTS = {
    "started": _started,
    "hashing": lambda tmp: _started(tmp) and (tmp / "wheelhouse" / ".rocwheels.lock").exists(),
    "writing": lambda tmp: any((tmp / "wheelhouse").glob(".simple-*")),
}


@SIGNALS
@pytest.mark.parametrize("point", list(INDEX_POINTS))
def test_index_build_interrupted_then_rebuilt(tmp_path: Path, stop: signal.Signals, point: str) -> None:
    """Signals at several points of an index build: the old index or none, never a half one; a rerun succeeds."""
    wheelhouse = tmp_path / "wheelhouse"
    for number in range(40):
        write_wheel(wheelhouse, f"pkg{number}", "1.0+rocm9.9")
    process = start(["--wheelhouse", "wheelhouse", "--recipes-dir", "none", "index", "build"], tmp_path)
    wait_for(lambda: process.poll() is not None or INDEX_POINTS[point](tmp_path), point)
    if process.poll() is None:
        status, err = stop_and_wait(process, stop)
        # A fast machine may finish first; a signal after the cleanup ends the process the default way.
        assert status in (0, 128 + stop) or (status == -stop and "requirements-rocm9.9.txt" in err), err
        assert "Traceback" not in err
    else:
        process.communicate()
    assert leftovers(tmp_path) == []
    link = wheelhouse / "simple"
    assert not link.exists() or (link / "rocm9.9" / "index.html").is_file()
    again = start(["--wheelhouse", "wheelhouse", "--recipes-dir", "none", "index", "build"], tmp_path)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert (wheelhouse / "constraints-rocm9.9.txt").read_text().count("==1.0+rocm9.9") == 40
    assert leftovers(tmp_path) == []


SMOKE_POINTS = ["venv", "install"]


@pytest.mark.network
@SIGNALS
@pytest.mark.parametrize("point", SMOKE_POINTS)
def test_verify_interrupted_in_the_smoke_test_then_verified(tmp_path: Path, stop: signal.Signals, point: str) -> None:
    """A signal while verify's smoke test makes its venv (in the work folder) or while pip installs
    into it: the venv and the private TMPDIR go, the wheelhouse keeps only the wheel, and the same
    verify then passes. pip is held at the install by an index that never finishes answering for
    the wheel's dependency."""
    project = small_project(tmp_path)
    wheel = write_wheel(project.wheelhouse, "alpha", "1.0+rocm9.9", requires=("beta",))
    links = tmp_path / "links"
    write_wheel(links, "beta", "1.0+rocm9.9")
    verify = ["--recipes-dir", "recipes", "--wheelhouse", "wheelhouse", "--work-dir", "build", "verify", str(wheel)]
    # Only this test's indexes: not the machine's pip configuration.
    pip_env = {"PIP_CONFIG_FILE": os.devnull}
    with stalling_server() as (url, pip_asked):
        process = start(verify, tmp_path, {**pip_env, "PIP_INDEX_URL": url + "file/"})
        if point == "venv":
            # pyvenv.cfg is written first; ensurepip then takes seconds
            wait_for(
                lambda: process.poll() is not None or any(project.work.glob("rocwheels-smoke-*/venv/pyvenv.cfg")),
                "the smoke test's venv is being made",
            )
            assert not pip_asked.is_set()
        else:
            wait_for(lambda: process.poll() is not None or pip_asked.is_set(), "pip asks the index for beta")
        assert process.poll() is None, process.communicate()
        status, err = stop_and_wait(process, stop)
    assert status == 128 + stop, err
    assert "Traceback" not in err and "interrupted by signal" in err
    assert leftovers(tmp_path) == []
    assert list(project.work.iterdir()) == []  # no venv left in the work folder
    assert sorted(p.name for p in project.wheelhouse.iterdir() if p.is_file()) == [wheel.name]

    again = start(verify, tmp_path, {**pip_env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)})
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, out + err
    assert "alpha imported" in out
    assert leftovers(tmp_path) == [] and list(project.work.iterdir()) == []


def test_a_child_process_is_stopped_with_rocwheels(tmp_path: Path) -> None:
    """SIGTERM reaches only rocwheels (a CI cancel): the command it runs must not go on writing."""
    marker = tmp_path / "child-still-running"
    script = tmp_path / "child.py"
    script.write_text(
        "import sys\nfrom pathlib import Path\nfrom pipeline.util.cmd import run\nfrom pipeline.util.interrupts import interruptible\n"
        "from pipeline.errors import Interrupted\n"
        "try:\n    with interruptible():\n"
        f"        run(['sh', '-c', 'sleep 3; touch {marker}'], log_file=Path({str(tmp_path / 'log')!r}))\n"
        "except Interrupted as exc:\n    sys.exit(exc.exit_code)\n"
    )
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, script], env=env, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (tmp_path / "log").exists(), "the child starts")
    status, err = stop_and_wait(process, signal.SIGTERM)
    assert status == 143, err
    time.sleep(3.5)
    assert not marker.exists()
    assert list((tmp_path / "tmp").iterdir()) == []


def _dead_pid() -> int:
    finished = subprocess.Popen([sys.executable, "-c", ""])
    finished.wait()
    return finished.pid


def test_interrupted_run_leaves_nothing_for_the_next(tmp_path: Path) -> None:
    """Leftovers of a run killed with SIGKILL (no cleanup possible) are removed by the next run;
    a user's own dot files of the same shapes, and a live run's TMPDIR folder, are not touched."""
    wheelhouse = tmp_path / "wheelhouse"
    write_wheel(wheelhouse, "alpha", "1.0+rocm9.9")
    dead = _dead_pid()
    (wheelhouse / f".alpha-1.0+rocm9.9-py3-none-any.whl.rocwheels-{dead}-x1y2.partial").write_bytes(b"half")
    (wheelhouse / f".simple-rocwheels-{dead}-abc").mkdir()
    users = [".notes.partial", ".simple-mine", ".simple-old.link"]
    for name in users:
        (wheelhouse / name).write_text("the user's\n")
    # TMPDIR: the folder of a run killed with SIGKILL (its lock file unlocked) and one of a live run.
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(exist_ok=True)
    (tmpdir / "rocwheels-run-dead").mkdir()
    (tmpdir / "rocwheels-run-dead" / ".owner.lock").touch()
    (tmpdir / "rocwheels-run-dead" / "big").write_bytes(b"x" * 1000)
    live = tmpdir / "rocwheels-run-live"
    live.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX); print(flush=True); sys.stdin.read()",
            str(live / ".owner.lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdout is not None
    holder.stdout.readline()
    result = run(
        index_build_argv(wheelhouse, tmp_path / "none"),
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmpdir)},
    )
    holder.communicate(b"")
    assert "removed leftovers of an interrupted run" in result.output
    assert sorted(
        p.name for p in wheelhouse.iterdir() if p.name.startswith(".") and p.name != ".rocwheels.lock"
    ) == sorted([(wheelhouse / "simple").resolve().name, *users])
    assert sorted(p.name for p in tmpdir.iterdir()) == ["rocwheels-run-live"]


# Each signal in turn after 0, 1/N, 2/N ... of an undisturbed run's time.
MOMENTS = 16


def test_a_signal_at_any_moment_prints_no_traceback(tmp_path: Path) -> None:
    """SIGINT and SIGTERM at moments spread over a whole short command: the command line's imports,
    the command's own (each import has a weakref callback, where Python could only print the
    Interrupted), its cleanup and the interpreter's shutdown. Never a traceback nor an "Exception
    ignored", 128 + N whenever rocwheels took the signal, and nothing left behind.

    The process starts with both signals ignored: before rocwheels's first line runs, Python's own
    start-up (the site module) would print a KeyboardInterrupt that no program can prevent.
    """
    for number in range(3):
        write_wheel(tmp_path / "wheelhouse", f"pkg{number}", "1.0+rocm9.9")
    args = ["--wheelhouse", "wheelhouse", "--recipes-dir", "none", "index", "build"]
    began = time.monotonic()
    undisturbed = start(args, tmp_path)
    assert undisturbed.wait(timeout=120) == 0, undisturbed.communicate()[1]
    whole = time.monotonic() - began
    taken = 0
    for moment in range(MOMENTS):
        stop = (signal.SIGINT, signal.SIGTERM)[moment % 2]
        process = start(args, tmp_path, ignoring_signals=True)
        time.sleep(whole * moment / MOMENTS)
        status, err = stop_and_wait(process, stop)
        where = f"{stop.name} after {whole * moment / MOMENTS:.3f} s of {whole:.3f} s: status {status}\n{err}"
        assert "Traceback" not in err and "Exception ignored" not in err, where
        # 0: before rocwheels's policy or after the end; -N: in the interpreter's last moments, where
        # Python has given the signal back its default action (a shell shows 128 + N then too).
        assert status in (0, 128 + stop, -stop), where
        assert leftovers(tmp_path) == [], where
        taken += status != 0
    # Most land while rocwheels runs; fewer than a quarter would mean its policy was barely tried.
    assert taken >= MOMENTS // 4, f"only {taken} of {MOMENTS} signals landed while rocwheels ran"


# A signal whose Interrupted Python cannot raise: in a __del__, as in an import's weakref callback.
_SWALLOWED = """
import signal, sys, time
from pipeline.errors import Interrupted
from pipeline.util.interrupts import interruptible

class SignalledWhileCollected:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)

try:
    with interruptible():
        SignalledWhileCollected()
        {then}
    print("not interrupted")
except Interrupted as exc:
    sys.exit(exc.exit_code)
"""


@pytest.mark.parametrize("then", ["time.sleep(30)", "pass"], ids=["then-waits", "then-ends"])
def test_a_signal_python_cannot_raise_is_raised_again(tmp_path: Path, then: str) -> None:
    """Python prints an exception raised in a __del__ or a weakref callback as "Exception ignored"
    and goes on: the Interrupted of a signal landing there still ends the command, quietly, whether
    the body then waits (interrupted a moment later) or ends (interrupted at its end)."""
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": str(REPO)}
    script = _SWALLOWED.format(then=then)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (130, "", "")
    assert list((tmp_path / "tmp").iterdir()) == []


REPAIR_POINTS = {
    # auditwheel has unpacked the wheel into rocwheels' private TMPDIR
    "auditwheel": lambda tmp: any((tmp / "tmp").glob(f"{PRIVATE_PREFIX}*/rocwheels-repair-*")),
    # the repaired wheel is being written beside its final name
    "writing": lambda tmp: any((tmp / "out").glob(".*.partial")),
}


@SIGNALS
@pytest.mark.parametrize("point", list(REPAIR_POINTS))
def test_repair_interrupted_then_repaired(tmp_path: Path, built: Built, stop: signal.Signals, point: str) -> None:
    """Signals while auditwheel works and while the result is written: TMPDIR and the output folder stay clean."""
    raw = write_platform_wheel(
        tmp_path / "raw",
        "recentpkg",
        {
            f"recentpkg/_recent{EXT}": built.recent,
            "recentpkg/data.bin": os.urandom(24 << 20),  # incompressible: writing takes a moment
        },
    )
    args = ["--recipes-dir", "none", "repair", "-w", str(tmp_path / "out"), str(raw)]
    process = start(args, tmp_path)
    wait_for(lambda: process.poll() is not None or REPAIR_POINTS[point](tmp_path), point, timeout=120)
    if process.poll() is None:
        status, err = stop_and_wait(process, stop)
        # The point may pass before the signal lands; after the cleanup it ends the process the default way.
        assert status in (0, 128 + stop, -stop), err
        assert "Traceback" not in err
    else:
        process.communicate()
    assert leftovers(tmp_path) == []
    assert [p.name for p in (tmp_path / "out").glob(".*")] in ([], [".rocwheels.lock"])

    again = start(args, tmp_path)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert Path(out.strip()).is_file()
    assert leftovers(tmp_path) == []


@pytest.mark.hipcc
def test_build_interrupted_while_compiling_then_built(
    tmp_path: Path, hipcc: str, canary_targets: tuple[str, ...]
) -> None:
    """SIGTERM (a CI cancel) while the canary compiles: the build tools stop, no wheel is left
    half-written, TMPDIR is clean, and the same command builds next time."""
    args = [
        "--recipes-dir",
        str(REPO / "recipes"),
        "--wheelhouse",
        "wheelhouse",
        "--work-dir",
        "work",
        "build",
        "--driver",
        "local",
        "--arch",
        canary_targets[0],
        "--recipes",
        "rocm-canary",
    ]
    log = tmp_path / "wheelhouse" / "logs" / "rocm-canary.log"
    process = start(args, tmp_path, {"HIP_PLATFORM": "amd"})
    wait_for(
        lambda: process.poll() is not None or (log.exists() and "-m build --wheel" in log.read_text()),
        "the compile starts",
        timeout=300,
    )
    status, err = stop_and_wait(process, signal.SIGTERM)
    assert status == 143, err
    assert "Traceback" not in err and "interrupted by signal 15" in err
    assert leftovers(tmp_path) == []
    assert not list(tmp_path.rglob("*.whl"))

    again = start(args, tmp_path, {"HIP_PLATFORM": "amd"})
    out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    assert "raw wheel" in out and leftovers(tmp_path) == []
