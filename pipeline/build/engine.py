"""Which container engine runs the builder image: podman if it works, else a reachable docker.

Podman runs with the project's own settings (``docker/podman/*.conf``), so builds neither depend
on nor change ``/etc/containers``; a user's own ``CONTAINERS_CONF`` / ``CONTAINERS_STORAGE_CONF``
win over them. Docker is the engine ``DOCKER_HOST`` (or the client's context) points at; it must
build with BuildKit (the builder's Dockerfile uses cache mounts): docker clients before 23 have
it built in, later ones through the buildx plugin.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import RocwheelsError
from pipeline.util.cmd import run

# Only a source checkout has these; an installed rocwheels (as inside the builder image, where
# it only repairs wheels) never starts containers.
PODMAN_CONFIG_DIR = Path(__file__).resolve().parents[2] / "docker" / "podman"

INSTALL_FIX = (
    "install podman (Debian/Ubuntu: `apt-get install -y podman runc`; Fedora/EL: "
    "`dnf install -y podman`; see https://podman.io/docs/installation), or start a Docker engine"
)


@dataclass(frozen=True)
class Engine:
    """A working container engine.

    ``name`` is also what cibuildwheel's ``container-engine`` option expects; every call must run
    with ``env`` merged over the environment (cibuildwheel's too, since it calls the engine
    itself).
    """

    name: str
    argv_prefix: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict, hash=False)

    def command(self, *args: str | os.PathLike[str]) -> list[str | os.PathLike[str]]:
        return [*self.argv_prefix, *args]


ENGINES = ("podman", "docker")


def detect_engine(only: str | None = None) -> Engine:
    """Podman, preferred because it needs no daemon; docker only if its engine answers.
    ``only`` restricts the choice to that engine.

    Each candidate is asked for ``info``: that catches a docker client with no engine behind it
    and a podman whose runtime cannot start.
    """
    problems: list[str] = []
    fixes: list[str] = []
    podman = shutil.which("podman") if only in (None, "podman") else None
    if podman:
        env = podman_env()
        result = run([podman, "info", "--format", "{{.Host.OCIRuntime.Name}}"], env=env, check=False)
        if result.returncode == 0:
            return Engine("podman", (podman,), env)
        problems.append(f"`{podman} info` failed: {_last_line(result.output)}")
    docker = shutil.which("docker") if only in (None, "docker") else None
    if docker:
        result = run([docker, "info", "--format", "{{.ServerVersion}}"], check=False)
        if result.returncode != 0:
            problems.append(f"`{docker} info` reached no Docker engine: {_last_line(result.output)}")
        elif not _has_buildkit(docker):
            problems.append(f"{docker} cannot build with BuildKit (no buildx plugin), which the builder image needs")
            fixes.append(
                "install Docker's buildx plugin (Debian/Ubuntu: `apt-get install -y docker-buildx`; Docker's own "
                "repository: docker-buildx-plugin)"
            )
        else:
            # BuildKit for clients that still default to the legacy builder (before 23).
            return Engine("docker", (docker,), {"DOCKER_BUILDKIT": "1"})
    if not problems:
        problems.append(f"{only} is not on PATH" if only else "neither podman nor docker is on PATH")
    raise RocwheelsError(
        "no working container engine for the builder image (" + "; ".join(problems) + ")",
        fix="; or ".join([*fixes, INSTALL_FIX]),
    )


def _has_buildkit(docker: str) -> bool:
    """A buildx plugin, or a client from before 23, whose `build` has BuildKit built in."""
    if run([docker, "buildx", "version"], check=False, quiet=True).returncode == 0:
        return True
    client = run([docker, "version", "--format", "{{.Client.Version}}"], check=False, quiet=True).output.strip()
    major = client.split(".", 1)[0]
    return major.isdigit() and int(major) < 23


def podman_env() -> dict[str, str]:
    """The CONTAINERS_* variables pointing podman at the project's settings, where not set."""
    env: dict[str, str] = {}
    conf = PODMAN_CONFIG_DIR / "containers.conf"
    if "CONTAINERS_CONF" not in os.environ and conf.is_file():
        env["CONTAINERS_CONF"] = str(conf)
    storage = PODMAN_CONFIG_DIR / "storage.conf"
    # The storage file names root's locations; rootless podman keeps its per-user storage.
    if "CONTAINERS_STORAGE_CONF" not in os.environ and os.geteuid() == 0 and storage.is_file():
        env["CONTAINERS_STORAGE_CONF"] = str(storage)
    return env


def _last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
