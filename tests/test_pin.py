"""`rocwheels lock pin` against a real registry: Debian's docker-registry on loopback, an image
pushed to it with podman, the digest read back from the registry's own HTTP API."""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.error import URLError
from urllib.request import Request, urlopen

import pytest

from pipeline.build.engine import Engine
from pipeline.build.image import image_id
from pipeline.config.lock import load_lock
from pipeline.config.pin import PIN_NOTE, ImageRef
from pipeline.util.cmd import run
from tests.helpers import ROCWHEELS, unused_port

REPO = Path(__file__).resolve().parents[1]

# What podman pushes (OCI) and what Docker pushes; the registry answers with the stored one.
MANIFEST_TYPES = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"
PUSHED = "rocwheels/pin-test:v1"
REGISTRY_STARTUP_SECONDS = 30

LOCK = """# A lock with comments and layout that a pin must keep.
schema_version = 1
default_line = "local"

# Built here: nothing to pin.
[lines.local]
rocm = "5.7.1"
builder_image = "localhost/rocwheels-base:trixie"
image_source = "built locally by `rocwheels image base --suite trixie`"
python = ["3.13"]
targets = ["gfx90a", "gfx942"]   # probed

[lines.local.versions]
rocm-canary = "0.1.0"

# From a registry, by tag: the pin's target.
[lines."reg.1"]
rocm = "6.2.4"
builder_image = "IMAGE"
image_source = "unverified: tag named in the vendor's build script; no digest published - pin it with `rocwheels lock pin --rocm reg.1`"
python = ["3.12"]
targets = ["gfx942"]

[lines."reg.1".versions]
rocm-canary = "0.1.0"
"""


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian's docker-registry (distribution 2.8) on a free loopback port with its own storage."""
    root = tmp_path_factory.mktemp("registry")
    port = unused_port()
    config = root / "config.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root / 'storage'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    with (root / "registry.log").open("w") as sink:
        process = subprocess.Popen(["docker-registry", "serve", config], stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + REGISTRY_STARTUP_SECONDS
        while True:
            assert process.poll() is None, (root / "registry.log").read_text()
            try:
                with urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1):
                    break
            except (URLError, OSError):
                assert time.monotonic() < deadline, "docker-registry did not answer"
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait()


@pytest.fixture(scope="module")
def insecure_registries(registry: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """registries.conf letting podman talk plain HTTP to the test registry (no TLS on loopback)."""
    conf = tmp_path_factory.mktemp("containers") / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
        yield


@pytest.fixture(scope="module")
def pushed(
    registry: str, insecure_registries: None, podman_engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A one-file image pushed to the registry by tag; the local copy stays (a pin must still
    find the digest the registry serves, not the one of the locally made manifest)."""
    root = tmp_path_factory.mktemp("image")
    (root / "hello").write_text("rocwheels lock pin test\n")
    with tarfile.open(root / "rootfs.tar", "w") as archive:
        archive.add(root / "hello", "hello")
    local, remote = f"localhost/rocwheels-pin-test:{registry.rsplit(':', 1)[1]}", f"{registry}/{PUSHED}"
    env = podman_engine.env
    run(podman_engine.command("import", root / "rootfs.tar", local), env=env)
    run(podman_engine.command("push", "--tls-verify=false", local, remote), env=env)
    made = image_id(podman_engine, local)
    assert made is not None, f"{local} was imported but podman does not list it"
    try:
        yield remote
    finally:
        # By ID: the pin's pull by digest adds names of its own.
        run(podman_engine.command("rmi", "--force", made), env=env)


def registry_digest(image: str) -> str:
    """The manifest digest as the registry reports it (HTTP API v2, Docker-Content-Digest)."""
    ref = ImageRef.parse(image)
    path = ref.repository.split("/", 1)[1]
    request = Request(
        f"http://{ref.registry}/v2/{path}/manifests/{ref.tag}", method="HEAD", headers={"Accept": MANIFEST_TYPES}
    )
    with urlopen(request, timeout=10) as response:
        return str(response.headers["Docker-Content-Digest"])


def lock_dir(tmp_path: Path, image: str) -> Path:
    (tmp_path / "lock.toml").write_text(LOCK.replace("IMAGE", image))
    return tmp_path


def rocwheels(recipes_dir: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"PATH": path} if path is not None else {})}
    return subprocess.run(
        [*ROCWHEELS, "--recipes-dir", recipes_dir, "lock", "pin", *args],
        capture_output=True,
        text=True,
        env=env,
    )


def changed_lines(before: str, after: str) -> list[str]:
    return [
        line
        for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


@pytest.mark.container
@pytest.mark.network
def test_pin_writes_the_digest_the_registry_serves_and_keeps_the_file(pushed: str, tmp_path: Path) -> None:
    recipes = lock_dir(tmp_path, pushed)
    before = (recipes / "lock.toml").read_text()

    result = rocwheels(recipes, "--rocm", "reg.1")
    assert result.returncode == 0, result.stderr

    digest = registry_digest(pushed)
    after = (recipes / "lock.toml").read_text()
    image_line, source_line = [line for line in changed_lines(before, after) if line.startswith("+")]
    assert image_line == f'+builder_image = "{pushed}@{digest}"'
    assert source_line.startswith(f'+image_source = "{PIN_NOTE} on ')
    assert source_line.endswith(
        f" from {ImageRef.parse(pushed).registry} (tag {pushed}); before pinning: tag named in the vendor's build script\""
    )
    assert len(changed_lines(before, after)) == 4, "only builder_image and image_source change"
    line = load_lock(recipes).line("reg.1")
    assert line.pinned and line.builder_image == f"{pushed}@{digest}"
    assert f"lines.reg.1: pinned: {pushed}@{digest}" in result.stdout
    assert sorted(p.name for p in recipes.iterdir()) == ["lock.toml"], "no temporary file left"

    again = rocwheels(recipes, "--rocm", "reg.1")
    assert again.returncode == 0 and "already pinned" in again.stdout
    refreshed = rocwheels(recipes, "--rocm", "reg.1", "--refresh")
    assert refreshed.returncode == 0 and "unchanged" in refreshed.stdout, refreshed.stderr
    assert (recipes / "lock.toml").read_text() == after


@pytest.mark.container
@pytest.mark.network
@pytest.mark.parametrize(
    ("image", "message"),
    [
        ("{registry}/rocwheels/absent:v1", "has no image {registry}/rocwheels/absent:v1"),
        ("127.0.0.1:{closed}/rocwheels/pin-test:v1", "could not pull 127.0.0.1:{closed}/rocwheels/pin-test:v1"),
    ],
    ids=["missing-image", "unreachable-registry"],
)
def test_a_failed_pull_names_the_fix_and_leaves_the_lock_alone(
    registry: str, insecure_registries: None, podman_engine: Engine, tmp_path: Path, image: str, message: str
) -> None:
    values = {"registry": registry, "closed": str(unused_port())}
    recipes = lock_dir(tmp_path, image.format(**values))
    before = (recipes / "lock.toml").read_bytes()

    result = rocwheels(recipes, "--rocm", "reg.1")

    assert result.returncode == 1
    assert message.format(**values) in result.stderr
    assert "rocwheels lock pin --rocm reg.1" in result.stderr and "Traceback" not in result.stderr
    assert (recipes / "lock.toml").read_bytes() == before
    assert sorted(p.name for p in recipes.iterdir()) == ["lock.toml"]


def test_without_an_engine_the_install_is_the_fix_and_the_lock_stays(tmp_path: Path) -> None:
    recipes = lock_dir(tmp_path, "registry.example/rocm/dev:7.2")
    before = (recipes / "lock.toml").read_bytes()
    (tmp_path / "empty-bin").mkdir()

    result = rocwheels(recipes, "--rocm", "reg.1", path=str(tmp_path / "empty-bin"))

    assert result.returncode == 1
    assert "no working container engine" in result.stderr and "install podman" in result.stderr
    assert (recipes / "lock.toml").read_bytes() == before


def test_images_built_here_need_no_pin_and_no_engine(tmp_path: Path) -> None:
    recipes = lock_dir(tmp_path, "registry.example/rocm/dev:7.2")
    (tmp_path / "empty-bin").mkdir()
    result = rocwheels(recipes, path=str(tmp_path / "empty-bin"))  # default_line = "local"
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "lines.local: built locally: localhost/rocwheels-base:trixie"


@pytest.mark.parametrize(
    ("text", "registry", "by_tag", "digest"),
    [
        (
            "docker.io/rocm/dev-almalinux-8:6.2.4-complete",
            "docker.io",
            "docker.io/rocm/dev-almalinux-8:6.2.4-complete",
            None,
        ),
        ("rocm/dev-ubuntu-22.04:7.2-complete", "docker.io", "rocm/dev-ubuntu-22.04:7.2-complete", None),
        ("127.0.0.1:5000/a/b:v1@sha256:" + "a" * 64, "127.0.0.1:5000", "127.0.0.1:5000/a/b:v1", "sha256:" + "a" * 64),
        ("quay.io/pypa/manylinux_2_28_x86_64", "quay.io", "quay.io/pypa/manylinux_2_28_x86_64", None),
    ],
)
def test_image_references_split_as_engines_read_them(text: str, registry: str, by_tag: str, digest: str | None) -> None:
    ref = ImageRef.parse(text)
    assert (ref.registry, ref.by_tag, ref.digest) == (registry, by_tag, digest)


def test_refreshing_a_pin_without_a_tag_is_refused(tmp_path: Path) -> None:
    recipes = lock_dir(tmp_path, "registry.example/rocm/dev@sha256:" + "0" * 64)
    result = rocwheels(recipes, "--rocm", "reg.1", "--refresh", path=str(tmp_path))
    assert result.returncode == 1
    assert "names no tag to pull again" in result.stderr and "name:tag@sha256:" in result.stderr


def wheels_project(tmp_path: Path, image: str) -> Path:
    """A recipes folder whose line reg.1 names ``image`` by tag, with the canary recipe to build."""
    (tmp_path / "recipes").mkdir()
    recipes = lock_dir(tmp_path / "recipes", image)
    shutil.copy(REPO / "recipes" / "rocm-canary.toml", recipes)
    shutil.copytree(REPO / "recipes" / "rocm-canary", recipes / "rocm-canary", ignore=shutil.ignore_patterns("build"))
    # The line's build-environment lock, resolved from PyPI as a user's `lock constraints` would.
    resolved = subprocess.run(
        [*ROCWHEELS, "--recipes-dir", recipes, "lock", "constraints", "--rocm", "reg.1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert resolved.returncode == 0, resolved.stderr
    return recipes


def make_wheels_cli(recipes: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`rocwheels wheels` as `make wheels` runs it (CI unset unless ``env`` sets it)."""
    base_env = {k: v for k, v in os.environ.items() if k != "CI"}
    return subprocess.run(
        [
            *ROCWHEELS,
            "--recipes-dir",
            recipes,
            "--wheelhouse",
            recipes.parent / "wheelhouse",
            "--work-dir",
            recipes.parent / "work",
            "wheels",
            "--driver",
            "container",
            "--rocm",
            "reg.1",
            "--arch",
            "gfx942",
            *args,
        ],
        capture_output=True,
        text=True,
        env={**base_env, **(env or {})},
        timeout=600,
    )


@pytest.mark.container
@pytest.mark.network
def test_make_wheels_pins_an_unpinned_image_on_first_use_and_says_to_commit_it(pushed: str, tmp_path: Path) -> None:
    recipes = wheels_project(tmp_path, pushed)
    result = make_wheels_cli(recipes)
    line = load_lock(recipes).line("reg.1")
    assert line.pinned and line.builder_image == f"{pushed}@{registry_digest(pushed)}", result.stderr
    assert "commit" in result.stderr and str(recipes / "lock.toml") in result.stderr
    # The pushed one-file image is no ROCm builder: what follows may fail, but never for want of a pin.
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert not any("pinned" in line for line in errors) and "Traceback" not in result.stderr, errors


@pytest.mark.container
@pytest.mark.network
@pytest.mark.parametrize("how", ["--no-pin", "CI"])
def test_no_pin_and_ci_refuse_an_unpinned_image(pushed: str, tmp_path: Path, how: str) -> None:
    recipes = wheels_project(tmp_path, pushed)
    before = (recipes / "lock.toml").read_bytes()
    result = make_wheels_cli(
        recipes, *([how] if how == "--no-pin" else []), env={"CI": "true"} if how == "CI" else None
    )
    assert result.returncode == 1
    assert "not pinned by digest" in result.stderr and "rocwheels lock pin --rocm reg.1" in result.stderr
    assert "ROCM=debian13" in result.stderr and "DRIVER=local" in result.stderr, "the offline routes are named"
    assert (recipes / "lock.toml").read_bytes() == before


@pytest.mark.container
@pytest.mark.network
def test_an_unreachable_registry_names_the_cause_and_the_offline_routes(
    registry: str, insecure_registries: None, podman_engine: Engine, tmp_path: Path
) -> None:
    image = f"127.0.0.1:{unused_port()}/rocwheels/pin-test:v1"
    recipes = wheels_project(tmp_path, image)
    before = (recipes / "lock.toml").read_bytes()
    result = make_wheels_cli(recipes)
    assert result.returncode == 1
    assert f"could not pull {image}" in result.stderr
    assert "ROCM=debian13" in result.stderr and "DRIVER=local" in result.stderr
    assert "Traceback" not in result.stderr
    assert (recipes / "lock.toml").read_bytes() == before
