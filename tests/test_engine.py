"""Container engine detection, with fake engines on a controlled PATH (no containers run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.build.engine import PODMAN_CONFIG_DIR, detect_engine
from pipeline.errors import RocwheelsError


def fake_tool(folder: Path, name: str, exit_code: int, output: str = "") -> Path:
    tool = folder / name
    tool.write_text(f"#!/bin/sh\necho '{output}'\nexit {exit_code}\n")
    tool.chmod(0o755)
    return tool


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH holding only what a test puts there."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CONTAINERS_CONF", raising=False)
    monkeypatch.delenv("CONTAINERS_STORAGE_CONF", raising=False)
    return tmp_path


def test_no_engine_on_path_says_how_to_install(bin_dir: Path) -> None:
    with pytest.raises(RocwheelsError) as error:
        detect_engine()
    assert "neither podman nor docker is on PATH" in error.value.message
    assert "apt-get install -y podman runc" in (error.value.fix or "")


def test_docker_client_without_engine_is_not_an_engine(bin_dir: Path) -> None:
    fake_tool(bin_dir, "docker", 1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock")
    with pytest.raises(RocwheelsError) as error:
        detect_engine()
    assert "reached no Docker engine" in error.value.message
    assert "Cannot connect to the Docker daemon" in error.value.message


def test_podman_gets_the_project_settings(bin_dir: Path) -> None:
    podman = fake_tool(bin_dir, "podman", 0, "runc")
    engine = detect_engine()
    assert engine.name == "podman"
    assert engine.argv_prefix == (str(podman),)
    assert engine.env["CONTAINERS_CONF"] == str(PODMAN_CONFIG_DIR / "containers.conf")
    if os.geteuid() == 0:
        assert engine.env["CONTAINERS_STORAGE_CONF"] == str(PODMAN_CONFIG_DIR / "storage.conf")
    assert engine.command("build", ".") == [str(podman), "build", "."]


def test_users_own_podman_settings_win(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tool(bin_dir, "podman", 0, "runc")
    monkeypatch.setenv("CONTAINERS_CONF", "/etc/mine.conf")
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", "/etc/my-storage.conf")
    assert detect_engine().env == {}


def test_broken_podman_falls_back_to_a_working_docker(bin_dir: Path) -> None:
    fake_tool(bin_dir, "podman", 125, "Error: runc: OCI permission denied")
    docker = fake_tool(bin_dir, "docker", 0, "27.0.1")
    engine = detect_engine()
    # The fake answers `buildx version` too: a docker that builds with BuildKit, asked to.
    assert (engine.name, engine.argv_prefix, dict(engine.env)) == ("docker", (str(docker),), {"DOCKER_BUILDKIT": "1"})


def fake_docker(folder: Path, *, buildx: bool, client: str) -> Path:
    """A docker client whose engine answers, with or without the buildx plugin."""
    tool = folder / "docker"
    tool.write_text(
        f'#!/bin/sh\ncase "$1" in\n  info) echo 28.0.0 ;;\n  buildx) exit {0 if buildx else 1} ;;\n'
        f"  version) echo {client} ;;\nesac\n"
    )
    tool.chmod(0o755)
    return tool


@pytest.mark.parametrize(("buildx", "client"), [(True, "28.2.2"), (False, "20.10.24+dfsg1")])
def test_docker_that_builds_with_buildkit_is_taken(bin_dir: Path, buildx: bool, client: str) -> None:
    fake_docker(bin_dir, buildx=buildx, client=client)
    assert detect_engine("docker").name == "docker"


def test_docker_without_buildkit_names_the_plugin_to_install(bin_dir: Path) -> None:
    fake_docker(bin_dir, buildx=False, client="28.2.2")
    with pytest.raises(RocwheelsError) as error:
        detect_engine("docker")
    assert "cannot build with BuildKit" in error.value.message
    assert "apt-get install -y docker-buildx" in (error.value.fix or "")


def test_broken_podman_and_no_docker_reports_podmans_error(bin_dir: Path) -> None:
    fake_tool(bin_dir, "podman", 125, "Error: runc: OCI permission denied")
    with pytest.raises(RocwheelsError, match="OCI permission denied"):
        detect_engine()


def test_project_podman_settings_exist() -> None:
    conf = (PODMAN_CONFIG_DIR / "containers.conf").read_text()
    assert 'runtime = "runc"' in conf and 'cgroup_manager = "cgroupfs"' in conf
    assert '"nofile=20000:20000"' in conf
    assert 'driver = "overlay"' in (PODMAN_CONFIG_DIR / "storage.conf").read_text()
