"""Docker as the container engine: a real Docker daemon (Debian's docker.io) with its own socket,
data root and exec root, the debootstrapped Debian 13 base moved into it from podman
(`podman save | docker load`), and the canary built, repaired, smoke-tested and verified through
the container driver with docker; `doctor` and `image test` with docker; two container builds
sharing their compilations through a real Redis.

A Docker engine already answering (DOCKER_HOST, or the default socket) is used as it is.
Otherwise the tests start dockerd; its data root stays under /var/tmp between runs, so the base
(~45 s to load) and the builder image (~2 min to build) are made once. Costs ~1 min after that.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.build.container import builder_image, container_driver
from pipeline.build.engine import Engine, _has_buildkit, detect_engine
from pipeline.config.layout import Layout
from pipeline.config.lock import load_lock
from pipeline.doctor import engine_check, image_test
from pipeline.plan import Plan
from pipeline.util.cmd import run
from pipeline.wheel.analyze import analyze_wheel
from pipeline.wheel.archive import parse_wheel_name
from pipeline.wheels import make_wheels
from tests.helpers import REPO
from tests.helpers.recipes import recipes_plan
from tests.helpers.redis_server import running_redis
from tests.helpers.wheels import the_build

RECIPES = REPO / "recipes"
DATA_ROOT = Path("/var/tmp/rocwheels-test-docker")
# A private subnet for the daemon's bridge, away from the usual 172.17/16 of a system docker.
BRIDGE_ADDRESS = "10.213.7.1/24"
ARCH = ("gfx942", "gfx90a")


def _docker_answers(env: dict[str, str]) -> bool:
    docker = shutil.which("docker")
    return docker is not None and run([docker, "info"], env=env, check=False, quiet=True).returncode == 0


@pytest.fixture(scope="session")
def docker_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """DOCKER_HOST of a working Docker engine: the one already running, else a dockerd of the tests."""
    if _docker_answers({}):
        yield os.environ.get("DOCKER_HOST", "")
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        pytest.fail("dockerd is not installed: apt-get install -y docker.io")
    run_dir = tmp_path_factory.mktemp("dockerd")
    host = f"unix://{run_dir}/docker.sock"
    log = (run_dir / "dockerd.log").open("w")
    process = subprocess.Popen(
        [
            dockerd,
            "--host",
            host,
            "--data-root",
            DATA_ROOT,
            "--exec-root",
            run_dir / "exec",
            "--pidfile",
            run_dir / "docker.pid",
            "--bip",
            BRIDGE_ADDRESS,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(300):
            assert process.poll() is None, f"dockerd exited with {process.returncode}: see {run_dir / 'dockerd.log'}"
            if _docker_answers({"DOCKER_HOST": host}):
                break
            time.sleep(0.1)
        yield host
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()


def _buildkit_client() -> str:
    """The folder of the first docker client on PATH that builds with BuildKit (a newer client
    without the buildx plugin cannot; Debian's docker.io client has BuildKit built in)."""
    for folder in os.environ["PATH"].split(os.pathsep):
        client = Path(folder) / "docker"
        if client.is_file() and _has_buildkit(str(client)):
            return folder
    pytest.fail("no docker client on PATH builds with BuildKit: apt-get install -y docker.io (or docker-buildx)")


@pytest.fixture(scope="session")
def docker_engine(docker_host: str) -> Iterator[Engine]:
    """The docker engine as rocwheels detects it when asked for docker (``--engine docker``)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DOCKER_HOST", docker_host)
        env.setenv("PATH", _buildkit_client() + os.pathsep + os.environ["PATH"])  # cibuildwheel runs `docker` from PATH
        engine = detect_engine("docker")
        assert engine.name == "docker"
        yield engine


@pytest.fixture(scope="session")
def docker_trixie_base(docker_engine: Engine, trixie_base: str) -> str:
    """The Debian 13 base in docker: moved over from podman once (the same debootstrap image)."""
    if (
        run(
            docker_engine.command("image", "inspect", trixie_base), env=docker_engine.env, check=False, quiet=True
        ).returncode
        != 0
    ):
        podman = detect_engine("podman")
        run(
            [
                "bash",
                "-euo",
                "pipefail",
                "-c",
                f'"$1" save {trixie_base} | "$2" load',
                "copy",
                podman.argv_prefix[0],
                docker_engine.argv_prefix[0],
            ],
            env={**podman.env, **docker_engine.env},
        )
    return trixie_base


def debian13_plan(base: str) -> Plan:
    """The canary on the lock's debian13 line, with the test base under it."""
    line = load_lock(RECIPES).line("debian13").model_copy(update={"builder_image": base})
    return recipes_plan(RECIPES, ["rocm-canary"], ("debian13", line), ARCH, driver="container")


@pytest.mark.container
def test_doctor_checks_docker(docker_engine: Engine, docker_host: str) -> None:
    check = engine_check("docker")
    assert check.ok is True and check.detail.startswith(f"docker ({docker_engine.argv_prefix[0]}")
    assert docker_host in check.detail


@pytest.mark.container
def test_the_canary_builds_in_the_builder_image_with_docker(
    docker_engine: Engine, docker_trixie_base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROCWHEELS_CCACHE_DIR", str(tmp_path / "ccache"))
    layout = Layout(RECIPES, tmp_path / "wheelhouse", tmp_path / "work")
    plan = debian13_plan(docker_trixie_base)
    line = plan.line
    (outcome,) = make_wheels(plan, layout, container_driver(plan, layout, engine=docker_engine))
    log = layout.log_file("rocm-canary").read_text()
    assert outcome.status == "built", f"{outcome.detail}\n{log[-3000:]}"
    assert "(docker)" in log.splitlines()[0]
    wheel = the_build(outcome.wheels)
    assert {tag.interpreter for tag in parse_wheel_name(wheel.name)[3]} == {"cp313"}
    (extension,) = [m for m in analyze_wheel(wheel).members if m.gpu_targets]
    assert sorted(extension.gpu_targets) == sorted(ARCH)

    # `image test` with docker: rocminfo in that builder image where there is a GPU, a plain
    # "not started" without one.
    tag = builder_image("debian13", line, docker_engine, recipes_dir=RECIPES)  # made by the build: found, not rebuilt
    check = image_test(docker_engine, tag)
    if Path("/dev/kfd").exists():
        assert check.ok is not None and tag in check.detail
    else:
        assert check.ok is None and "was not started" in check.detail


@pytest.mark.container
@pytest.mark.network
def test_container_builds_share_compilations_through_redis(
    docker_engine: Engine, docker_trixie_base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runners (separate work folders, no ccache) build in the builder container with the
    shared cache: Redis with a password on the docker bridge's gateway, which the containers
    reach; the password goes in through sccache's own variable."""
    inspect = docker_engine.command("network", "inspect", "bridge", "--format", "{{(index .IPAM.Config 0).Gateway}}")
    gateway = run(inspect, env=docker_engine.env, quiet=True).output.strip()
    plan = debian13_plan(docker_trixie_base)
    notes = []
    monkeypatch.setenv("SCCACHE_REDIS_PASSWORD", "runner-secret")
    with running_redis(gateway, tmp_path, password="runner-secret") as url:
        monkeypatch.setenv("ROCWHEELS_SCCACHE", url)
        for runner in ("first", "second"):
            layout = Layout(RECIPES, tmp_path / runner / "wheelhouse", tmp_path / runner / "work")
            (outcome,) = make_wheels(plan, layout, container_driver(plan, layout, engine=docker_engine))
            assert outcome.status == "built", f"{outcome.detail}\n{layout.log_file('rocm-canary').read_text()[-3000:]}"
            notes.append(outcome.detail)
    location = f"cache {url} (prefix rocwheels/debian13/)"
    assert notes == [
        f"sccache: 0% hits (0 of 1 compilations), {location}",
        f"sccache: 100% hits (1 of 1 compilations), {location}",
    ]
