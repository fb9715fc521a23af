"""Fixtures shared by the test modules."""

from __future__ import annotations

import base64
import hashlib
import os
import platform
import shutil
import stat
import sys
import threading
import zipfile
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

# Session fixtures that build real HIP wheels live in their own module.
from hip_wheels import built, hip_extensions, ld_library_path, repaired  # noqa: F401 (fixtures)

from pipeline.build.engine import Engine, detect_engine
from pipeline.build.host import host_rocm_version
from pipeline.config.layout import Layout
from pipeline.config.lock import load_lock, select_line
from pipeline.config.recipes import load_recipes
from pipeline.config.targets import parse_targets
from pipeline.config.toolchain import HIP_ENV
from pipeline.plan import Plan, make_plan
from pipeline.util.cmd import run

# Processors worth trying: a session keeps those the local hipcc compiles for (HIP 5.2 rejects
# gfx942 and lacks device libraries for gfx1100; newer toolchains take more).
CANDIDATE_TARGETS = ("gfx908", "gfx90a", "gfx940", "gfx942", "gfx950", "gfx1030", "gfx1100")
KERNEL = """#include <hip/hip_runtime.h>
__global__ void add_one(float* x) { x[threadIdx.x] += 1.0f; }
"""


def recipe_toml(
    name: str,
    version: str = "1.0",
    *,
    depends_on: tuple[str, ...] = (),
    supported: tuple[str, ...] = ("gfx90a", "gfx942"),
    env: dict[str, str] | None = None,
) -> str:
    """The text of a small valid recipe (recipes and plan tests)."""
    env_table = "[env]\n" + "".join(f'{key} = "{value}"\n' for key, value in (env or {}).items()) if env else ""
    return (
        f'name = "{name}"\ndepends_on = {list(depends_on)!r}\n{env_table}'
        f'[targets]\nenv = "PYTORCH_ROCM_ARCH"\nsupported = {list(supported)!r}\n'
        f'[smoke]\nimports = ["{name.replace("-", "_")}"]\n'
        f'[versions."{version}".source]\npath = "."\n'
    ).replace("'", '"')


def offload_args(targets: tuple[str, ...]) -> list[str]:
    return [f"--offload-arch={target}" for target in targets]


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
        args = [hipcc, "--genco", f"--offload-arch={target}", hip_kernel, "-o", out]
        return run(args, env=HIP_ENV, check=False).returncode == 0

    with ThreadPoolExecutor() as pool:
        works = list(pool.map(compiles, CANDIDATE_TARGETS))
    targets = tuple(t for t, ok in zip(CANDIDATE_TARGETS, works) if ok)
    if not targets:
        pytest.fail(f"hipcc compiles for none of {', '.join(CANDIDATE_TARGETS)}")
    return targets


@pytest.fixture(scope="session")
def hip_library(hipcc: str, hip_kernel: Path, hip_targets: tuple[str, ...]) -> Path:
    """A real HIP shared library with device code for every probed target."""
    library = hip_kernel.with_name("libkernel.so")
    args = [hipcc, "-fPIC", "-shared", *offload_args(hip_targets), hip_kernel, "-o", library]
    run(args, env=HIP_ENV)
    return library


# --- wheels, fresh venvs and an isolated pip (publish and index tests) ---


# One fixed timestamp for every archive member: the same content always gives the same sha256.
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)


def _wheel_archive(
    path: Path,
    name: str,
    version: str,
    tag: str,
    purelib: bool,
    contents: dict[str, bytes],
    requires: tuple[str, ...] = (),
    provides_extras: tuple[str, ...] = (),
) -> Path:
    """Write ``contents`` plus METADATA, WHEEL and a correct RECORD as the wheel ``path``."""
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    contents = dict(contents)
    contents[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Provides-Extra: {e}\n" for e in provides_extras)
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    ).encode()
    contents[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: rocwheels-tests\nRoot-Is-Purelib: {str(purelib).lower()}\nTag: {tag}\n"
    ).encode()
    record = [
        f"{member},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for member, data in contents.items()
    ]
    contents[f"{dist_info}/RECORD"] = ("\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in contents.items():
            info = zipfile.ZipInfo(member, _ZIP_DATE)
            # S_IFREG too: pip marks a file executable only when the mode says it is a regular file.
            info.external_attr = (stat.S_IFREG | (0o755 if data.startswith((b"\x7fELF", b"#!")) else 0o644)) << 16
            archive.writestr(info, data)
    return path


def _write_wheel(directory: Path, name: str, version: str, build: str = "ours", requires: tuple[str, ...] = ()) -> Path:
    module = name.replace("-", "_")
    return _wheel_archive(
        directory / f"{module}-{version}-py3-none-any.whl",
        name,
        version,
        "py3-none-any",
        True,
        {f"{module}/__init__.py": f"BUILD = {build!r}\n".encode()},
        requires,
    )


@pytest.fixture
def make_wheel() -> Callable[..., Path]:
    """``make_wheel(dir, name, version, build="ours", requires=())`` writes a small valid pure-Python wheel.

    ``build`` becomes ``<module>.BUILD``, so two files of one name and version differ and an
    install shows which one pip took.
    """
    return _write_wheel


@pytest.fixture
def fresh_venv(tmp_path: Path) -> Path:
    """A new, empty venv; returns its python (fill it with the ``pip_install`` fixture)."""
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    return venv / "bin" / "python"


def _pip_install(python: Path, *args: str) -> str:
    argv = [
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


def _platform_wheel(
    directory: Path,
    name: str,
    files: Mapping[str, bytes | Path],
    *,
    version: str = "1.0",
    platform_tag: str | None = None,
) -> Path:
    """A wheel of ``files`` (member -> content or file to copy) with WHEEL, METADATA and a correct RECORD."""
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    plat = platform_tag or f"linux_{platform.machine()}"
    contents = {member: data if isinstance(data, bytes) else data.read_bytes() for member, data in files.items()}
    return _wheel_archive(
        directory / f"{name}-{version}-{python}-{python}-{plat}.whl",
        name,
        version,
        f"{python}-{python}-{plat}",
        False,
        contents,
    )


@pytest.fixture(scope="session")
def platform_wheel() -> Callable[..., Path]:
    """``platform_wheel(dir, name, {member: bytes | Path}, version="1.0", platform_tag=None)``.

    Writes a valid ``cpXY-cpXY-linux_<machine>`` wheel (platlib) holding those files.
    """
    return _platform_wheel


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


def _raw_zip(path: Path, members: Mapping[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


@pytest.fixture(scope="session")
def raw_zip() -> Callable[[Path, Mapping[str, bytes]], Path]:
    """``raw_zip(path, {member: bytes})``: an archive exactly as given (no RECORD or metadata added),
    for wheels that are broken on purpose."""
    return _raw_zip


# --- the canary recipe on this host's lock line (build and wheels tests) ---


REPO = Path(__file__).resolve().parents[1]


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


def canary_plan(layout: Layout, line, targets: tuple[str, ...], driver: str = "local") -> Plan:
    name, lock_line = line
    return make_plan(
        load_recipes(layout.recipes_dir),
        ["rocm-canary"],
        recipes_dir=layout.recipes_dir,
        line_name=name,
        line=lock_line,
        targets=parse_targets(";".join(targets)),
        driver=driver,
    )


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
