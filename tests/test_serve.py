"""The team index: htpasswd users and a pypiserver that always stops with its owner."""

from __future__ import annotations

import base64
import json
import signal
import socket
import subprocess
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest
from passlib.apache import HtpasswdFile

from pipeline.errors import RocwheelsError
from pipeline.publish.serve import add_htpasswd_user, running_pypiserver
from pipeline.verify.provenance import record_path, write_record
from tests.helpers import ROCWHEELS, unused_port
from tests.helpers.waiting import answers, wait_for


def test_htpasswd_users_are_added_and_updated(tmp_path):
    htpasswd = tmp_path / "auth" / "htpasswd"
    add_htpasswd_user(htpasswd, "alice", "first")
    add_htpasswd_user(htpasswd, "bob", "other")
    add_htpasswd_user(htpasswd, "alice", "second")

    users = HtpasswdFile(str(htpasswd))
    assert sorted(users.users()) == ["alice", "bob"]
    assert users.check_password("alice", "second") and not users.check_password("alice", "first")
    assert htpasswd.read_text().startswith("alice:$5$")  # sha256-crypt, not htpasswd's MD5 default
    assert htpasswd.stat().st_mode & 0o777 == 0o600


def test_no_htpasswd_file_is_a_clear_error(tmp_path):
    with (
        pytest.raises(RocwheelsError, match=r"(?s)no htpasswd file at .*rocwheels index add-user"),
        running_pypiserver(tmp_path / "packages", tmp_path / "htpasswd"),
    ):
        pass


@pytest.mark.network
def test_the_server_stops_when_the_block_fails(tmp_path):
    add_htpasswd_user(tmp_path / "htpasswd", "alice", "pw")
    with (
        pytest.raises(RuntimeError, match="the caller failed"),
        running_pypiserver(tmp_path / "packages", tmp_path / "htpasswd") as index,
    ):
        with urlopen(index.simple_url, timeout=5) as page:
            assert page.status == 200
        raise RuntimeError("the caller failed")
    assert index.process.poll() is not None
    assert index.url.startswith("http://127.0.0.1:")


@pytest.mark.network
def test_a_port_in_use_is_a_clear_error(tmp_path):
    add_htpasswd_user(tmp_path / "htpasswd", "alice", "pw")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        with (
            pytest.raises(RocwheelsError, match=f"port {port} on 127.0.0.1 is already in use"),
            running_pypiserver(
                tmp_path / "packages", tmp_path / "htpasswd", port=port, log_file=tmp_path / "pypiserver.log"
            ),
        ):
            pass
    assert not (tmp_path / "pypiserver.log").exists()  # caught before pypiserver could print a traceback


@pytest.mark.network
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_stopping_serve_stops_pypiserver_too(tmp_path, stop):
    add_htpasswd_user(tmp_path / "htpasswd", "alice", "pw")
    port = unused_port()
    argv = [
        *ROCWHEELS,
        "serve",
        "--packages",
        tmp_path / "packages",
        "--htpasswd",
        tmp_path / "htpasswd",
        "--port",
        str(port),
    ]
    # Popen, not cmd.run: the test must signal the command while it runs.
    rocwheels = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        health = f"http://127.0.0.1:{port}/health"
        wait_for(lambda: answers(health), f"{health} answers", timeout=20)
        rocwheels.send_signal(stop)  # to rocwheels alone, as `kill PID` would
        assert rocwheels.wait(timeout=20) == 128 + stop
    finally:
        if rocwheels.poll() is None:
            rocwheels.kill()
            rocwheels.wait()
    with socket.socket() as client:
        assert client.connect_ex(("127.0.0.1", port)) != 0  # nothing listens there any more


def _request(url: str, method: str = "GET", data: bytes | None = None, login: str | None = None) -> tuple[int, bytes]:
    request = Request(url, data=data, method=method)
    if login:
        request.add_header("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
    try:
        with urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except HTTPError as answer:
        return answer.code, answer.read()


@pytest.mark.network
def test_provenance_records_are_served_beside_the_wheels_and_taken_only_if_true(tmp_path, make_wheel):
    """pypiserver keeps the wheels; the record of one is at <wheel URL>.provenance.json, stored
    with the upload login and only when it names that wheel's very sha256."""
    add_htpasswd_user(tmp_path / "htpasswd", "alice", "pw")
    packages = tmp_path / "packages"
    local = make_wheel(tmp_path / "wheelhouse", "rocm-canary", "0.1.0+rocm9.9")
    record = write_record(local, "f" * 64, {"recipe": "rocm-canary"}, {"driver": "local"}).read_bytes()
    packages.mkdir()
    wheel = packages / local.name
    wheel.write_bytes(local.read_bytes())  # as twine uploads it
    forged = json.dumps({**json.loads(record), "sha256": "0" * 64}).encode()
    other_inputs = json.dumps({**json.loads(record), "fingerprint": "e" * 64}).encode()
    with running_pypiserver(packages, tmp_path / "htpasswd") as index:
        page = urlopen(f"{index.simple_url}rocm-canary/", timeout=10).read().decode()
        (href,) = [part for part in page.split('"') if part.startswith("/packages/")]
        url = index.url.rstrip("/") + href.split("#")[0] + ".provenance.json"

        assert _request(url)[0] == 404  # none yet
        assert _request(url, "PUT", record)[0] == 401
        assert _request(url, "PUT", record, "alice:wrong")[0] == 403
        status, reason = _request(url, "PUT", forged, "alice:pw")
        assert status == 409 and b"describes other bytes" in reason
        assert _request(url, "PUT", b"{}", "alice:pw")[0] == 400
        assert _request(url.replace("rocm_canary-0.1.0", "rocm_canary-9.9"), "PUT", record, "alice:pw")[0] == 404
        assert _request(url, "PUT", record, "alice:pw")[0] == 201
        assert _request(url, "PUT", record, "alice:pw")[0] == 200  # the same again: nothing to do
        assert _request(url, "PUT", other_inputs, "alice:pw")[0] == 409  # never replaced
        assert _request(url) == (200, record)  # downloads need no login, as pypiserver's own
        assert urlopen(f"{index.simple_url}rocm-canary/", timeout=10).read().decode() == page  # not listed as a file
    assert sorted(p.name for p in packages.iterdir()) == [wheel.name, record_path(wheel).name]  # nothing half-written
