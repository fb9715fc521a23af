"""The shared compiler cache: ROCWHEELS_SCCACHE read into sccache's settings (fast), then a real
redis-server on loopback shared by two "runners" (separate work folders, empty local caches)
building the canary: the second one's compilations come from Redis.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from cibuildwheel.options import CommandLineArguments, compute_options

from pipeline.build.compiler_cache import remote_cache
from pipeline.build.container import SCCACHE_HIPCC, cibuildwheel_env
from pipeline.build.engine import Engine
from pipeline.build.local import local_driver_for
from pipeline.config.layout import Layout
from pipeline.config.lock import load_lock
from pipeline.errors import RocwheelsError
from pipeline.wheels import make_wheels
from tests.helpers import REPO
from tests.helpers.recipes import canary_plan
from tests.helpers.redis_server import running_redis


def test_no_setting_keeps_the_local_ccache() -> None:
    assert remote_cache("rocm7.2", {}) is None
    assert remote_cache("rocm7.2", {"ROCWHEELS_SCCACHE": " "}) is None


def test_redis_with_a_password_is_masked_and_keyed_by_line() -> None:
    cache = remote_cache("rocm7.2", {"ROCWHEELS_SCCACHE": "redis://:s3cret@cache.example:6379/2"})
    assert cache is not None
    assert cache.env == {
        "SCCACHE_REDIS_ENDPOINT": "redis://:s3cret@cache.example:6379/2",
        "SCCACHE_REDIS_KEY_PREFIX": "rocwheels/rocm7.2",
    }
    assert "s3cret" not in cache.location and "cache.example:6379" in cache.location
    assert cache.secret == "s3cret"


def test_s3_and_webdav() -> None:
    s3 = remote_cache("rocm6.2", {"ROCWHEELS_SCCACHE": "s3://team-cache/ci"})
    assert s3 is not None and s3.env == {
        "SCCACHE_BUCKET": "team-cache",
        "SCCACHE_S3_KEY_PREFIX": "ci/rocwheels/rocm6.2",
    }
    dav = remote_cache("rocm6.2", {"ROCWHEELS_SCCACHE": "webdav+https://dav.example/cache"})
    assert dav is not None and dav.env == {
        "SCCACHE_WEBDAV_ENDPOINT": "https://dav.example/cache",
        "SCCACHE_WEBDAV_KEY_PREFIX": "rocwheels/rocm6.2",
    }


def test_an_unknown_backend_names_the_setting_and_the_choices() -> None:
    with pytest.raises(RocwheelsError) as error:
        remote_cache("rocm6.2", {"ROCWHEELS_SCCACHE": "memcached://host:11211"})
    assert "ROCWHEELS_SCCACHE" in error.value.message and "redis://" in (error.value.fix or "")


@pytest.fixture
def redis_url(tmp_path: Path):
    with running_redis("127.0.0.1", tmp_path) as url:
        yield url


@pytest.mark.hipcc
@pytest.mark.network
def test_a_second_runner_compiles_nothing_the_first_compiled(
    tmp_path, redis_url, host_line, canary_targets, monkeypatch
) -> None:
    monkeypatch.setenv("ROCWHEELS_SCCACHE", redis_url)
    notes = []
    for runner in ("first", "second"):
        layout = Layout(REPO / "recipes", tmp_path / runner / "wheelhouse", tmp_path / runner / "build")
        plan = canary_plan(layout, host_line, canary_targets[:1])
        (outcome,) = make_wheels(plan, layout, local_driver_for(plan))
        assert outcome.status == "built", outcome.detail
        notes.append(outcome.detail)
    location = f"cache {redis_url} (prefix rocwheels/{host_line[0]}/)"
    assert notes == [
        f"sccache: 0% hits (0 of 1 compilations), {location}",
        f"sccache: 100% hits (1 of 1 compilations), {location}",
    ]


def test_container_builds_reach_the_shared_cache_as_cibuildwheel_reads_it(tmp_path, monkeypatch) -> None:
    """The builder container compiles through sccache with the cache's settings and logins passed
    verbatim, and no ccache folder mounted (cibuildwheel's own option reader decides)."""
    monkeypatch.setenv("SCCACHE_REDIS_PASSWORD", "pa$$ `word`")
    shared = remote_cache("debian13", {"ROCWHEELS_SCCACHE": "redis://cache.example:6379"})
    layout = Layout(REPO / "recipes", tmp_path / "wheelhouse", tmp_path / "work")
    plan = canary_plan(layout, ("debian13", load_lock(REPO / "recipes").line("debian13")), ("gfx942",))
    settings = cibuildwheel_env(
        plan,
        plan.steps[0],
        engine=Engine("docker", ("docker",)),
        image="localhost/rocwheels-builder:x",
        ccache=tmp_path / "ccache",
        gpu=False,
        shared=shared,
    )
    arguments = dataclasses.replace(
        CommandLineArguments.defaults(), platform="linux", config_file=os.devnull, package_dir=tmp_path
    )
    options = compute_options("linux", arguments, settings)
    build = options.build_options("cp313-manylinux_x86_64")
    environment = build.environment.as_dictionary({"HOME": "/root", "PATH": "/usr/bin"})
    assert {environment[f"CMAKE_{lang}_COMPILER_LAUNCHER"] for lang in ("C", "CXX", "HIP")} == {"sccache"}
    assert environment["HIPCC"] == SCCACHE_HIPCC and environment["SCCACHE_BASEDIRS"] == "/project"
    assert environment["SCCACHE_REDIS_ENDPOINT"] == "redis://cache.example:6379"
    assert environment["SCCACHE_REDIS_KEY_PREFIX"] == "rocwheels/debian13"
    assert environment["SCCACHE_REDIS_PASSWORD"] == "pa$$ `word`"
    assert "CCACHE_DIR" not in environment
    assert build.container_engine.name == "docker" and build.container_engine.create_args == ()
