"""A real redis-server for the shared compiler cache tests: on a free port of one address, keeping nothing on disk.

Also used by benchmarks/rebuild.py, which runs without pytest (`make bench` installs rocwheels alone)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import unused_port


@contextmanager
def running_redis(address: str, folder: Path, password: str | None = None) -> Iterator[str]:
    """``redis://address:port`` of a redis-server bound to ``address`` alone, stopped on exit.

    Off loopback Redis serves only clients that log in (protected mode): give ``password`` there.
    """
    server = shutil.which("redis-server")
    if server is None:
        raise RuntimeError("redis-server is not installed: apt-get install -y redis-server")
    port = unused_port(address)
    process = subprocess.Popen(
        [
            server,
            "--bind",
            address,
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(folder),
            *(["--requirepass", password] if password else []),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            assert process.poll() is None, f"redis-server exited with {process.returncode}"
            with socket.socket() as client:
                if client.connect_ex((address, port)) == 0:
                    break
            time.sleep(0.05)
        yield f"redis://{address}:{port}"
    finally:
        process.terminate()
        process.wait()
