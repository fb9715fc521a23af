"""The road to the index under faults: uploads cut short, servers that never answer, logins in URLs.

Against a real `rocwheels serve` (pypiserver through pipeline/publish/pypiserver_records.py) and
real sockets on loopback; every wait is bounded by the time limit under test.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.error import HTTPError
from urllib.parse import quote
from urllib.request import urlopen

import pytest

from pipeline.ci import fetch_from_index
from pipeline.config.layout import Layout
from pipeline.errors import RocwheelsError
from pipeline.plan import select_plan
from pipeline.publish.serve import UPLOAD_PREFIX, add_htpasswd_user, running_pypiserver
from pipeline.publish.upload import publish
from pipeline.verify.signing import new_key
from tests.helpers.signing import rocwheels, trust_keys
from tests.helpers.wheels import write_wheel

# The entry point binds rocwheels' log to each run's stderr (tests/helpers/signing.py).
pytestmark = pytest.mark.usefixtures("fresh_rocwheels_log")

REPO = Path(__file__).resolve().parents[1]
USER = "builder"
SECRET = "s3cret/p@ss:word"  # URL-special characters: it travels percent-encoded in the URL


@pytest.fixture
def served(tmp_path: Path, monkeypatch) -> Iterator[tuple[str, Path, Path]]:
    """(upload URL, packages folder, pypiserver log) of a running `rocwheels serve` index."""
    add_htpasswd_user(tmp_path / "htpasswd", USER, SECRET)
    log = tmp_path / "pypiserver.log"
    with running_pypiserver(tmp_path / "packages", tmp_path / "htpasswd", log_file=log) as server:
        yield server.url, tmp_path / "packages", log


def _multipart(wheel: Path, digest: str | None) -> tuple[bytes, str]:
    """The form twine sends (fields first, then the file), as bytes and its content type."""
    boundary = "rocwheels-test-boundary"
    fields = {":action": "file_upload", "protocol_version": "1", "name": "alpha", "version": "1.0+rocm9.9"}
    if digest is not None:
        fields["sha256_digest"] = digest
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="content"; filename="{wheel.name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n".encode()
        + wheel.read_bytes()
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def _raw_upload(url: str, body: bytes, content_type: str, *, send: int | None = None) -> bytes:
    """POST ``body`` with a login; ``send`` bytes of it only, then close (an upload cut short)."""
    host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    login = base64.b64encode(f"{USER}:{SECRET}".encode()).decode()
    head = (
        f"POST / HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Basic {login}\r\nUser-Agent: twine/test\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(head + body[: len(body) if send is None else send])
        if send is not None:
            return b""
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _listed(url: str, project: str) -> bool:
    try:
        with urlopen(f"{url}simple/{project}/", timeout=10):
            return True
    except HTTPError as exc:
        assert exc.code == 404
        return False


@pytest.mark.network
def test_an_interrupted_upload_leaves_nothing_listed_and_publishing_again_succeeds(tmp_path, served, monkeypatch):
    url, packages, _ = served
    wheelhouse = tmp_path / "wheelhouse"
    # Large enough that half of it is many TCP segments, as a real wheel cut short would be.
    wheel = write_wheel(wheelhouse, "alpha", "1.0+rocm9.9", build="x" * 2_000_000)
    body, content_type = _multipart(wheel, hashlib.sha256(wheel.read_bytes()).hexdigest())

    _raw_upload(url, body, content_type, send=len(body) // 2)
    time.sleep(1)  # the server notices the closed connection
    assert not _listed(url, "alpha")
    assert list(packages.iterdir()) == [], "neither a truncated wheel nor a temporary file is left"

    monkeypatch.setenv("TWINE_USERNAME", USER)
    monkeypatch.setenv("TWINE_PASSWORD", SECRET)
    result = publish(wheelhouse, url, attempts=1)
    assert result.uploaded == (wheel,)
    assert (packages / wheel.name).read_bytes() == wheel.read_bytes()


@pytest.mark.network
def test_an_upload_is_stored_only_with_the_sha256_the_client_sent(tmp_path, served):
    url, packages, _ = served
    wheel = write_wheel(tmp_path, "alpha", "1.0+rocm9.9")
    body, content_type = _multipart(wheel, "0" * 64)
    answer = _raw_upload(url, body, content_type)
    assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"is not the sha256_digest" in answer
    body, content_type = _multipart(wheel, None)
    assert b"as sha256_digest (twine does)" in _raw_upload(url, body, content_type)
    assert not _listed(url, "alpha") and list(packages.iterdir()) == []


def test_a_killed_servers_upload_leftovers_are_removed_at_the_next_start(tmp_path):
    packages = tmp_path / "packages"
    packages.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = packages / f"{UPLOAD_PREFIX}{dead.pid}-0000-alpha-1.0-py3-none-any.whl"
    leftover.write_bytes(b"half")
    users_file = packages / ".user-notes.partial"  # not ours: kept
    users_file.write_text("mine")
    add_htpasswd_user(tmp_path / "htpasswd", USER, SECRET)
    with running_pypiserver(packages, tmp_path / "htpasswd"):
        pass
    assert not leftover.exists() and users_file.exists()


@contextmanager
def _silent_socket() -> Iterator[int]:
    """A loopback port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


class _ListsButNeverTakesUploads(http.server.BaseHTTPRequestHandler):
    """An index whose pages answer (empty) and whose upload never does."""

    def do_GET(self) -> None:
        body = b"<html><body></body></html>"
        self.send_response(200 if self.path.rstrip("/").endswith("simple") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        time.sleep(30)  # longer than any limit under test

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.network
def test_publish_to_an_index_that_never_answers_stops_at_the_time_limit(tmp_path, capsys, monkeypatch):
    wheelhouse = tmp_path / "wheelhouse"
    write_wheel(wheelhouse, "alpha", "1.0+rocm9.9")
    monkeypatch.setenv("TWINE_USERNAME", USER)
    monkeypatch.setenv("TWINE_PASSWORD", SECRET)
    with _silent_socket() as port:
        started = time.monotonic()
        code, output = rocwheels(
            capsys,
            *("--wheelhouse", str(wheelhouse), "publish", "--attempts", "1", "--timeout", "1"),
            *("--repository", f"http://127.0.0.1:{port}/"),
        )
        assert time.monotonic() - started < 15
    assert code == 1 and "no answer within 1 s" in output and "Traceback" not in output

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ListsButNeverTakesUploads)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        with pytest.raises(RocwheelsError, match=r"upload to .*no answer within 2 s"):
            publish(wheelhouse, f"http://127.0.0.1:{server.server_port}/", attempts=1, timeout=2)
        assert time.monotonic() - started < 25  # twine's own start-up included
    finally:
        server.shutdown()
        server.server_close()


def test_reuse_from_an_index_that_never_answers_stops_at_the_time_limit(tmp_path):
    recipes = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", recipes)
    trust_keys(recipes, [new_key(tmp_path / "team.key").public])
    layout = Layout(recipes, tmp_path / "wheelhouse", tmp_path / "build")
    plan = select_plan(layout, "rocm-canary", "gfx90a", "debian12", "container")
    with _silent_socket() as port:
        started = time.monotonic()
        with pytest.raises(RocwheelsError, match=r"no answer within 1 s"):
            fetch_from_index(plan, layout, f"http://127.0.0.1:{port}/simple/", timeout=1)
        assert time.monotonic() - started < 10


@pytest.mark.network
def test_a_password_in_the_url_reaches_no_command_line_and_no_log(tmp_path, served, capsys, monkeypatch, caplog):
    url, packages, server_log = served
    monkeypatch.delenv("TWINE_USERNAME", raising=False)
    monkeypatch.delenv("TWINE_PASSWORD", raising=False)
    wheelhouse = tmp_path / "wheelhouse"
    wheel = write_wheel(wheelhouse, "alpha", "1.0+rocm9.9")
    children: list[tuple[list[str], dict[str, str]]] = []
    real_popen = subprocess.Popen  # what pipeline.util.cmd starts every child with

    def spying_popen(argv, *args, **kwargs):
        children.append(([str(a) for a in argv], dict(kwargs.get("env") or {})))
        return real_popen(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", spying_popen)
    with_login = url.replace("http://", f"http://{USER}:{quote(SECRET, safe='')}@")
    with caplog.at_level("DEBUG", logger="rocwheels"):
        code, output = rocwheels(
            capsys, "--wheelhouse", str(wheelhouse), "publish", "--attempts", "1", "--repository", with_login
        )
    assert code == 0, output
    assert (packages / wheel.name).is_file()
    (twine,) = [(argv, env) for argv, env in children if "pipeline.publish.twine_once" in argv]
    assert twine[1]["TWINE_USERNAME"] == USER and twine[1]["TWINE_PASSWORD"] == SECRET
    forms = (SECRET, quote(SECRET, safe=""), base64.b64encode(f"{USER}:{SECRET}".encode()).decode())
    for argv, _ in children:
        assert not any(form in arg for form in forms for arg in argv), argv
    for text in (
        output,
        caplog.text,
        server_log.read_text(),
        *(p.read_text() for p in (wheelhouse / "logs").rglob("*") if p.is_file()),
    ):
        assert not any(form in text for form in forms)
