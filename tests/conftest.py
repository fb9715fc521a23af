"""Fixtures shared by the test modules; what they build them from is in tests/helpers/.

tests/ is a package (tests/__init__.py), so pytest's default import mode puts the folder above it,
the checkout, on sys.path and imports every test module as ``tests.<name>``: a module imports
shared code as ``tests.helpers.<module>``, and never conftest or another test module
(tests/test_layout.py checks it). The same works for ``pytest`` and ``python -m pytest`` from the
checkout and for any single file or folder given to either.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipeline.build.engine import Engine, detect_engine
from pipeline.build.host import host_rocm_version
from pipeline.config.lock import load_lock, select_line
from pipeline.util.cmd import run
from tests.helpers import REPO
from tests.helpers.hip import CANDIDATE_TARGETS, HIP_ENV, KERNEL, offload_args
from tests.helpers.wheels import write_platform_wheel, write_raw_zip, write_wheel

# Session fixtures that build real HIP wheels (built, hip_extensions, ld_library_path, repaired).
pytest_plugins = ("tests.helpers.hip_wheels",)

# The fixtures that give a test what `make check` leaves out (pyproject.toml has the markers): a
# test using one, directly or through another fixture, carries its marker without saying so.
MARKER_OF_FIXTURE = {"hipcc": "hipcc", "musl_gcc": "musl", "podman_engine": "container", "static_server": "network"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in MARKER_OF_FIXTURE.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


@pytest.fixture(scope="session")
def musl_gcc() -> str:
    found = shutil.which("musl-gcc")
    if found is None:
        pytest.fail("musl-gcc is not installed: apt-get install -y musl-tools (make test installs it)")
    return found


@pytest.fixture(scope="session")
def hipcc() -> str:
    path = shutil.which("hipcc")
    if path is None:
        pytest.fail("hipcc is not on PATH: these tests build real HIP code (apt-get install -y hipcc)")
    return path


@pytest.fixture(scope="session")
def hip_kernel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("hip") / "kernel.hip"
    source.write_text(KERNEL)
    return source


@pytest.fixture(scope="session")
def hip_targets(hipcc: str, hip_kernel: Path) -> tuple[str, ...]:
    """The candidate processors the local hipcc compiles a kernel for, in candidate order."""

    def compiles(target: str) -> bool:
        out = hip_kernel.with_name(f"probe-{target}.co")
        args: list[str | Path] = [hipcc, "--genco", f"--offload-arch={target}", hip_kernel, "-o", out]
        return run(args, env=HIP_ENV, check=False).returncode == 0

    with ThreadPoolExecutor() as pool:
        works = list(pool.map(compiles, CANDIDATE_TARGETS))
    targets = tuple(t for t, ok in zip(CANDIDATE_TARGETS, works, strict=True) if ok)
    if not targets:
        pytest.fail(f"hipcc compiles for none of {', '.join(CANDIDATE_TARGETS)}")
    return targets


@pytest.fixture(scope="session")
def hip_library(hipcc: str, hip_kernel: Path, hip_targets: tuple[str, ...]) -> Path:
    """A real HIP shared library with device code for every probed target."""
    library = hip_kernel.with_name("libkernel.so")
    args: list[str | Path] = [hipcc, "-fPIC", "-shared", *offload_args(hip_targets), hip_kernel, "-o", library]
    run(args, env=HIP_ENV)
    return library


# --- wheels, fresh venvs and an isolated pip (publish and index tests) ---


@pytest.fixture
def make_wheel() -> Callable[..., Path]:
    """``make_wheel(dir, name, version, build="ours", requires=())``: :func:`tests.helpers.wheels.write_wheel`."""
    return write_wheel


@pytest.fixture
def fresh_venv(tmp_path: Path) -> Path:
    """A new, empty venv; returns its python (fill it with the ``pip_install`` fixture)."""
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    return venv / "bin" / "python"


def _pip_install(python: Path, *args: str) -> str:
    argv: list[str | Path] = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "--isolated",
        "--disable-pip-version-check",
        "install",
        "--no-cache-dir",
        *args,
    ]
    return run(argv, env={"PIP_CONFIG_FILE": os.devnull}).output


@pytest.fixture
def pip_install() -> Callable[..., str]:
    """``pip_install(python, *args)``: pip install into that venv, blind to this machine's pip settings.

    /etc/xdg/pip, ~/.config/pip and PIP_* variables add indexes, find-links and constraints here:
    PIP_CONFIG_FILE=/dev/null skips every config file and --isolated every PIP_* variable, leaving
    only the indexes a test names. The pip doing the work is this project's (``--python`` aims it
    at the venv): Python 3.11's bundled pip 23.2 rejects any hash in a constraints file.
    """
    return _pip_install


def _installed_build(python: Path, module: str) -> str:
    code = f"import importlib.metadata as m, {module}; print(m.version({module!r}), {module}.BUILD)"
    return run([python, "-c", code]).output.strip()


@pytest.fixture
def installed_build() -> Callable[[Path, str], str]:
    """``installed_build(python, module)`` -> ``"<version> <BUILD>"`` as that venv imports it."""
    return _installed_build


# --- platform wheels holding real ELF files (repair and wheelfile tests) ---


@pytest.fixture(scope="session")
def platform_wheel() -> Callable[..., Path]:
    """``platform_wheel(dir, name, {member: bytes | Path}, version="1.0", platform_tag=None)``:
    :func:`tests.helpers.wheels.write_platform_wheel`."""
    return write_platform_wheel


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def _static_server(directory: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def static_server() -> Callable[[Path], AbstractContextManager[str]]:
    """``with static_server(dir) as url``: what ``python -m http.server -d DIR`` runs, on a free loopback port.

    In a thread of the test process: port 0 needs no guessing, and it stops with the test.
    """
    return _static_server


@pytest.fixture(scope="session")
def raw_zip() -> Callable[[Path, Mapping[str, bytes]], Path]:
    """``raw_zip(path, {member: bytes})``: :func:`tests.helpers.wheels.write_raw_zip`."""
    return write_raw_zip


# --- the canary recipe on this host's lock line (build and wheels tests) ---


@pytest.fixture(scope="session")
def host_line(hipcc):
    """(name, line) of the lock line for this host's ROCm (Debian 12: debian12, Debian 13: debian13)."""
    return select_line(load_lock(REPO / "recipes"), None, host_rocm_version())


@pytest.fixture(scope="session")
def canary_targets(hip_targets, host_line) -> tuple[str, ...]:
    """Targets both the local hipcc compiles (probed) and the host's lock line lists."""
    targets = tuple(t for t in hip_targets if t in host_line[1].targets)
    assert targets, f"hipcc compiles {hip_targets}, the lock line lists {host_line[1].targets}"
    return targets


# --- real podman and the debootstrapped Debian bases (container tests) ---


# Made once each by docker/test-base/make-base.sh (needs root, debootstrap and the Debian mirror),
# then reused. Debian 13's HIP 5.7 (clang 17) compiles gfx942, python3 3.13 (~90 s, ~1 GB);
# Debian sid's hipcc 7 (clang 21, HIP 6.4) also gfx950 and writes compressed offload bundles,
# python3 3.14 (~6 min on a busy 2-core host, ~1.2 GB). The lock's debian13 and debian-sid lines describe them.
TRIXIE_BASE = "localhost/rocwheels-test-base:trixie"
SID_BASE = "localhost/rocwheels-test-base:sid"


@pytest.fixture(scope="session")
def podman_engine() -> Engine:
    """The project's podman; the container tests fail, never skip, without it."""
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: apt-get install -y podman runc debootstrap")
    engine = detect_engine()
    assert engine.name == "podman", f"expected podman, found {engine.name}"
    return engine


def _debian_base(engine: Engine, suite: str, image: str) -> str:
    run(["bash", REPO / "docker" / "test-base" / "make-base.sh", suite, image], env=engine.env)
    return image


@pytest.fixture(scope="session")
def trixie_base(podman_engine: Engine) -> str:
    """The Debian 13 base image with Debian's HIP toolchain, made without a registry."""
    return _debian_base(podman_engine, "trixie", TRIXIE_BASE)


@pytest.fixture(scope="session")
def sid_base(podman_engine: Engine) -> str:
    """The Debian sid base image: a clang that writes compressed offload bundles."""
    return _debian_base(podman_engine, "sid", SID_BASE)


@pytest.fixture
def fresh_rocwheels_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests running the entry point in-process: no log handler left bound to an earlier run's stderr."""
    from tests.helpers.signing import no_stale_log_handler

    no_stale_log_handler(monkeypatch)
