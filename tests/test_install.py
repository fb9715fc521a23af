"""A teammate's install, run exactly as the README writes it, with the pips teammates have.

The commands are read from the README's "As a teammate" section; only the index URL is
swapped for a local one. Each installer (pip 23.2.1, what a fresh Python 3.11 venv brings; the
newest 24.x, 25.x and 26.x, all from PyPI; and uv) gets one venv for the module, and installs
one canary wheel from pypiserver and from the static index. The default index stands in for
PyPI and offers a higher version of the canary: the pins must keep it out.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.publish.index import build_static_index, write_constraints, write_requirements
from pipeline.publish.serve import add_htpasswd_user, running_pypiserver
from pipeline.util.cmd import run
from tests.helpers import REPO

README_URL = "http://buildhost:8080/simple/"
VERSION = "0.1.0+rocm6.2"  # the line the README's commands name
pytestmark = pytest.mark.network


def readme_commands() -> dict[str, list[str]]:
    """The install section's code blocks: the one-step pins form, then the hash-checked two steps."""
    text = (REPO / "README.md").read_text()
    section = text.split("### As a teammate", 1)[1].split("\n#", 1)[0]
    blocks = [
        [line.strip() for line in block.splitlines()]
        for block in re.findall(r"((?:^    pip install .*\n)+)", section, flags=re.MULTILINE)
    ]
    pins, hashes = blocks
    assert [len(pins), len(hashes)] == [1, 2], blocks
    return {"pins": pins, "hashes": hashes}


@dataclass(frozen=True)
class Installer:
    name: str
    python: Path  # the venv it installs into
    prefix: tuple[str, ...]  # what stands for "pip" in the README's commands

    def argv(self, readme_line: str, index_url: str) -> list[str]:
        words = shlex.split(readme_line.replace(README_URL, index_url))
        assert words[:2] == ["pip", "install"], readme_line
        into = ["--python", str(self.python)] if self.name == "uv" else []
        return [*self.prefix, "install", *into, *words[2:]]

    def uninstall(self, env: dict[str, str]) -> None:
        into = ["--python", str(self.python)] if self.name == "uv" else ["-y"]
        run([*self.prefix, "uninstall", *into, "rocm-canary"], env=env)


INSTALLERS = ["pip==23.2.1", "pip>=24,<25", "pip>=25,<26", "pip>=26,<27", "uv"]


@pytest.fixture(scope="module", params=INSTALLERS)
def installer(request, tmp_path_factory: pytest.TempPathFactory) -> Installer:
    venv = tmp_path_factory.mktemp("installer") / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    if request.param == "uv":
        uv = shutil.which("uv", path=sysconfig.get_path("scripts"))
        assert uv, "uv comes with rocwheels' environment"
        return Installer("uv", python, (uv, "pip"))
    # From PyPI (this machine's pip settings pick the mirror), into that venv only.
    run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--disable-pip-version-check", request.param]
    )
    return Installer(request.param, python, (str(python), "-m", "pip"))


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory, platform_wheel) -> Path:
    """The canary wheel with its index, constraints and requirements, as ``rocwheels index build`` leaves them."""
    house = tmp_path_factory.mktemp("wheelhouse")
    platform_wheel(house, "rocm_canary", {"rocm_canary/__init__.py": b"BUILD = 'ours'\n"}, version=VERSION)
    build_static_index(house)
    write_constraints(house)
    write_requirements(house)
    return house


@pytest.fixture(scope="module")
def tool_env(tmp_path_factory: pytest.TempPathFactory, platform_wheel) -> dict[str, str]:
    """The installers' environment: no settings of this machine, and a default index standing in
    for PyPI that offers a higher version of the canary."""
    pypi = tmp_path_factory.mktemp("pypi")
    platform_wheel(pypi, "rocm_canary", {"rocm_canary/__init__.py": b"BUILD = 'elsewhere'\n"}, version="0.2.0+rocm6.2")
    (simple,) = build_static_index(pypi)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    return {
        **env,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": simple.resolve().as_uri() + "/",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1",
        "UV_NO_CONFIG": "1",
        "UV_DEFAULT_INDEX": simple.resolve().as_uri() + "/",
        "UV_CACHE_DIR": str(tmp_path_factory.mktemp("uv-cache")),
    }


@pytest.fixture(scope="module")
def pypiserver_url(tmp_path_factory: pytest.TempPathFactory, wheelhouse) -> Iterator[str]:
    root = tmp_path_factory.mktemp("pypiserver")
    htpasswd = root / "htpasswd"
    add_htpasswd_user(htpasswd, "alice", "secret")
    (root / "packages").mkdir()
    for wheel in wheelhouse.glob("*.whl"):
        shutil.copy(wheel, root / "packages")
    with running_pypiserver(root / "packages", htpasswd, log_file=root / "pypiserver.log") as index:
        yield index.simple_url


@pytest.mark.parametrize("form", ["pins", "hashes"])
@pytest.mark.parametrize("server", ["pypiserver", "static"])
def test_readme_install(installer: Installer, server, form, wheelhouse, tool_env, pypiserver_url, static_server):
    commands = readme_commands()[form]
    with static_server(wheelhouse) as static_url:
        index_url = pypiserver_url if server == "pypiserver" else f"{static_url}simple/rocm6.2/"
        try:
            for line in commands:
                run(installer.argv(line, index_url), env=tool_env, cwd=wheelhouse)
            installed = run(
                [
                    installer.python,
                    "-c",
                    "import importlib.metadata as m, rocm_canary; print(m.version('rocm-canary'), rocm_canary.BUILD)",
                ]
            ).output.strip()
        finally:
            installer.uninstall(tool_env)
    assert installed == f"{VERSION} ours"


def test_pins_are_what_keeps_the_higher_version_out(tmp_path, wheelhouse, tool_env, static_server):
    """Without the constraints the stand-in PyPI's higher version wins: the trap the pins close."""
    python = tmp_path / "venv" / "bin" / "python"
    run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "venv"])
    with static_server(wheelhouse) as url:
        report = tmp_path / "report.json"
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                python,
                "install",
                "--dry-run",
                "--report",
                report,
                "--extra-index-url",
                f"{url}simple/rocm6.2/",
                "rocm-canary",
            ],
            env=tool_env,
        )
    assert '"version": "0.2.0+rocm6.2"' in report.read_text()
