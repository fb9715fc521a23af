"""Publishing to a real pypiserver with a login, and what a teammate's pip then installs."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import urlopen

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.errors import CommandError, RocwheelsError
from pipeline.publish.index import write_requirements
from pipeline.publish.serve import add_htpasswd_user, pypiserver_run, running_pypiserver
from pipeline.publish.upload import publish, resolve_repository
from pipeline.util.files import file_sha256
from pipeline.verify.provenance import check_record, record_path, write_record
from tests.helpers import unused_port
from tests.helpers.waiting import answers, wait_for

USER = "builder"
PASSWORD = "correct-horse-battery"  # the test checks that this never reaches a message or a log


@pytest.fixture(scope="module")
def htpasswd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("auth") / "htpasswd"
    add_htpasswd_user(path, USER, PASSWORD)
    return path


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, htpasswd: Path):
    root = tmp_path_factory.mktemp("index")
    with running_pypiserver(root / "packages", htpasswd, log_file=root / "pypiserver.log") as server:
        yield server


@pytest.fixture
def login(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWINE_USERNAME", USER)
    monkeypatch.setenv("TWINE_PASSWORD", PASSWORD)


def _publish_log(wheelhouse: Path) -> str:
    return (wheelhouse / "logs" / "publish.log").read_text()


@pytest.mark.network
def test_publish_uploads_once_then_skips_and_a_teammate_installs(
    tmp_path, index, login, make_wheel, fresh_venv, pip_install, installed_build
):
    wheelhouse = tmp_path / "wheelhouse"
    wheel = make_wheel(wheelhouse, "rocm-canary", "0.1.0+rocm9.9")
    record = write_record(wheel, "f" * 64, {"recipe": "rocm-canary"}, {"driver": "local"})

    first = publish(wheelhouse, index.url)
    second = publish(wheelhouse, index.url)

    assert (first.uploaded, first.skipped, first.records, first.records_refused) == ((wheel,), (), (record,), ())
    assert (second.uploaded, second.skipped, second.records) == ((), (wheel,), (record,))
    assert PASSWORD not in _publish_log(wheelhouse)
    with urlopen(f"{index.url}packages/{wheel.name}.provenance.json", timeout=10) as served:
        assert served.read() == record.read_bytes()  # beside the wheel, as on the static index
    (tmp_path / "empty").mkdir()
    pip_install(
        fresh_venv, "--index-url", (tmp_path / "empty").as_uri(), "--extra-index-url", index.simple_url, "rocm-canary"
    )
    assert installed_build(fresh_venv, "rocm_canary") == "0.1.0+rocm9.9 ours"


@pytest.mark.network
def test_a_login_in_the_url_works_and_is_masked_in_the_log(tmp_path, index, make_wheel, monkeypatch):
    monkeypatch.delenv("TWINE_USERNAME", raising=False)
    monkeypatch.delenv("TWINE_PASSWORD", raising=False)
    wheelhouse = tmp_path / "wheelhouse"
    wheel = make_wheel(wheelhouse, "url-login-demo", "1.0+rocm9.9")

    result = publish(wheelhouse, index.url.replace("http://", f"http://{USER}:{PASSWORD}@"))

    assert result.uploaded == (wheel,) and result.repository_url == index.url
    log = _publish_log(wheelhouse)
    assert PASSWORD not in log and f"{USER}:" not in log, "the login travels apart from the URL"


@pytest.mark.network
def test_same_file_name_with_other_contents_fails_naming_both_hashes(tmp_path, index, login, make_wheel):
    published = make_wheel(tmp_path / "first", "conflict-demo", "1.0+rocm9.9", build="first")
    publish(published.parent, index.url)
    rebuilt = make_wheel(tmp_path / "second", "conflict-demo", "1.0+rocm9.9", build="second")

    with pytest.raises(RocwheelsError) as failure:
        publish(rebuilt.parent, index.url)

    message = str(failure.value)
    assert rebuilt.name in message
    assert file_sha256(published) in message and file_sha256(rebuilt) in message


@pytest.mark.network
def test_wrong_password_from_pypirc_is_a_clear_error_without_the_password(tmp_path, index, make_wheel, monkeypatch):
    monkeypatch.delenv("TWINE_USERNAME", raising=False)
    monkeypatch.delenv("TWINE_PASSWORD", raising=False)
    wrong = "not-the-password-42"
    pypirc = tmp_path / "pypirc"
    pypirc.write_text(
        f"[distutils]\nindex-servers = team\n\n[team]\nrepository = {index.url}\n"
        f"username = {USER}\npassword = {wrong}\n"
    )
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse, "auth-demo", "1.0+rocm9.9")

    with pytest.raises(RocwheelsError) as failure:
        publish(wheelhouse, "team", config_file=pypirc, attempts=3, backoff_seconds=5)  # not retried: fast

    message = str(failure.value)
    assert f"the package index at {index.url} rejected the upload login (HTTP 403)" in message
    assert "fix:" in message and "TWINE_PASSWORD" in message
    assert wrong not in message and wrong not in _publish_log(wheelhouse)


@pytest.mark.network
def test_missing_login_is_a_clear_error(tmp_path, index, make_wheel, monkeypatch):
    monkeypatch.delenv("TWINE_USERNAME", raising=False)
    monkeypatch.delenv("TWINE_PASSWORD", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.pypirc
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse, "auth-demo", "1.0+rocm9.9")

    with pytest.raises(RocwheelsError, match=f"no login for {index.url}"):
        publish(wheelhouse, index.url)


@pytest.mark.network
def test_server_down_is_retried_then_a_clear_error(tmp_path, login, make_wheel, caplog):
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse, "rocm-canary", "0.1.0+rocm9.9")
    with socket.socket() as unused:  # bound but never listening: connections are refused
        unused.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unused.getsockname()[1]}/"
        with caplog.at_level("WARNING", logger="rocwheels"), pytest.raises(RocwheelsError) as failure:
            publish(wheelhouse, url, attempts=3, backoff_seconds=0.05)

    message = str(failure.value)
    assert f"{url}simple/" in message and "Connection refused" in message
    assert "gave up after 3 attempts" in message and "rocwheels serve" in message
    # Backed off 0.05 s, then 0.1 s, between the tries.
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert [m.split("retrying in ")[1] for m in retries] == ["0.05 s (attempt 2 of 3)", "0.1 s (attempt 3 of 3)"]


@pytest.mark.network
def test_a_5xx_answer_to_the_upload_is_retried(tmp_path, login, make_wheel, static_server):
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse, "rocm-canary", "0.1.0+rocm9.9")
    site = tmp_path / "site"  # lists nothing, and answers uploads (POST) with 501
    (site / "simple").mkdir(parents=True)
    (site / "simple" / "index.html").write_text("<!DOCTYPE html><html><body></body></html>")

    with static_server(site) as url, pytest.raises(RocwheelsError) as failure:
        publish(wheelhouse, url, attempts=2, backoff_seconds=0.05)

    assert f"upload to {url} failed: HTTPError: 501 (gave up after 2 attempts)" in str(failure.value)
    assert _publish_log(wheelhouse).count("twine_once --no-color upload") == 2


@pytest.mark.network
def test_one_layer_decides_retries_one_post_per_attempt(tmp_path, login, make_wheel):
    """twine's own five retries per file are off: two attempts send the wheel twice, not ten times."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    posts = []

    class Failing(BaseHTTPRequestHandler):
        def do_GET(self):
            page = b"<html><body></body></html>" if self.path == "/simple/" else b""
            self.send_response(200 if page else 404)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def do_POST(self):
            posts.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    make_wheel(tmp_path / "wheelhouse", "rocm-canary", "0.1.0+rocm9.9")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(RocwheelsError, match="gave up after 2 attempts"):
            publish(
                tmp_path / "wheelhouse",
                f"http://127.0.0.1:{server.server_address[1]}/",
                attempts=2,
                backoff_seconds=0.05,
            )
    finally:
        server.shutdown()
        server.server_close()
    assert len(posts) == 2


@pytest.mark.network
def test_an_index_that_comes_up_late_is_reached_by_a_retry(tmp_path, htpasswd, login, make_wheel):
    wheelhouse = tmp_path / "wheelhouse"
    wheel = make_wheel(wheelhouse, "rocm-canary", "0.1.0+rocm9.9")
    port = unused_port()
    published = threading.Event()

    def late_index() -> None:
        time.sleep(0.5)
        with running_pypiserver(tmp_path / "packages", htpasswd, port=port, log_file=tmp_path / "late.log"):
            published.wait(timeout=60)

    server = threading.Thread(target=late_index)
    server.start()
    try:
        result = publish(wheelhouse, f"http://127.0.0.1:{port}/", attempts=6, backoff_seconds=0.25)
    finally:
        published.set()
        server.join()
    assert result.uploaded == (wheel,)
    assert (tmp_path / "packages" / wheel.name).is_file()


def test_repository_urls_and_masked_credentials():
    with_login = resolve_repository("http://someone:s3cret@127.0.0.1:8080/legacy/")
    assert with_login.upload_url == "http://127.0.0.1:8080/legacy/"
    assert with_login.simple_url == "http://127.0.0.1:8080/simple/"
    assert "s3cret" in with_login.secrets and "s3cret" not in repr(with_login)
    devpi = resolve_repository(
        "http://127.0.0.1:3141/team/rocm/", simple_url="http://127.0.0.1:3141/team/rocm/+simple/"
    )
    assert devpi.simple_url.endswith("/+simple/")


def test_unknown_repository_name_is_a_clear_error(tmp_path):
    pypirc = tmp_path / "pypirc"
    pypirc.write_text("[distutils]\nindex-servers = team\n\n[team]\nrepository = http://127.0.0.1:8080/\n")
    with pytest.raises(RocwheelsError, match="cannot use repository 'nope'"):
        resolve_repository("nope", config_file=pypirc)


def test_empty_wheelhouse_has_nothing_to_publish(tmp_path):
    with pytest.raises(RocwheelsError, match="no wheels to publish"):
        publish(tmp_path, "http://127.0.0.1:8080/")


@pytest.mark.network
def test_a_file_changed_on_pypiserver_fails_the_hash_checked_install(
    tmp_path, htpasswd, login, make_wheel, fresh_venv, pip_install
):
    """pypiserver lists whatever bytes it holds (its #sha256 is computed from the file on its disk):
    the requirements file's sha256 from the wheelhouse catch a swapped file, and so does the
    provenance record published beside it."""
    wheelhouse = tmp_path / "wheelhouse"
    wheel = make_wheel(wheelhouse, "rocm-canary", "0.1.0+rocm9.9")
    write_record(wheel, "f" * 64, {"recipe": "rocm-canary"}, {"driver": "local"})
    (requirements,) = write_requirements(wheelhouse)
    with running_pypiserver(tmp_path / "packages", htpasswd, log_file=tmp_path / "pypiserver.log") as server:
        publish(wheelhouse, server.url)
        make_wheel(tmp_path / "elsewhere", "rocm-canary", "0.1.0+rocm9.9", build="tampered").replace(
            tmp_path / "packages" / wheel.name
        )
        with pytest.raises(CommandError, match="DO NOT MATCH THE HASHES"):
            pip_install(
                fresh_venv, "--index-url", server.simple_url, "--require-hashes", "--no-deps", "-r", requirements
            )
        downloads = tmp_path / "downloads"
        downloads.mkdir()
        for name in (wheel.name, record_path(wheel).name):
            with urlopen(f"{server.url}packages/{name}", timeout=10) as served:
                (downloads / name).write_bytes(served.read())
    ok, message = check_record(downloads / wheel.name)
    assert not ok and "differs from the provenance record's" in message
    verified = CliRunner().invoke(cli, ["verify", "--no-smoke", str(downloads / wheel.name)])
    assert verified.exit_code == 1 and "differs from the provenance record's" in verified.output


@contextmanager
def _plain_pypiserver(packages: Path, htpasswd: Path) -> Iterator[str]:
    """pypiserver as a team may run it, not started by rocwheels serve: it keeps distributions only."""
    port = unused_port()
    packages.mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen(
        [sys.executable, "-m", "pypiserver", *pypiserver_run("127.0.0.1", port, htpasswd, packages)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for(lambda: answers(url + "health"), f"{url}health answers", timeout=20)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.network
def test_a_plain_pypiserver_gets_the_wheels_and_a_warning_that_records_are_missing(
    tmp_path, htpasswd, login, make_wheel, caplog
):
    wheelhouse = tmp_path / "wheelhouse"
    wheel = make_wheel(wheelhouse, "rocm-canary", "0.1.0+rocm9.9")
    record = write_record(wheel, "f" * 64, {"recipe": "rocm-canary"}, {"driver": "local"})

    with _plain_pypiserver(tmp_path / "packages", htpasswd) as url, caplog.at_level("WARNING", logger="rocwheels"):
        result = publish(wheelhouse, url)

    assert (result.uploaded, result.records, result.records_refused) == ((wheel,), (), (record,))
    (warning,) = [r.getMessage() for r in caplog.records if "provenance" in r.getMessage()]
    assert f"{url} takes no provenance records" in warning and "HTTP 405" in warning
    assert "CI reuse from this index" in warning and "rocwheels serve" in warning
    assert [p.name for p in (tmp_path / "packages").iterdir()] == [wheel.name]


@pytest.mark.network
def test_a_wheel_that_no_longer_matches_its_record_is_not_published(tmp_path, index, login, make_wheel):
    wheelhouse = tmp_path / "wheelhouse"
    wheel = make_wheel(wheelhouse, "record-demo", "1.0+rocm9.9")
    write_record(wheel, "f" * 64, {}, {})
    make_wheel(wheelhouse, "record-demo", "1.0+rocm9.9", build="tampered")  # same name, other bytes

    with pytest.raises(RocwheelsError, match="is not the one verify accepted"):
        publish(wheelhouse, index.url)
    with pytest.raises(HTTPError):  # nothing of it reached the index
        urlopen(f"{index.simple_url}record-demo/", timeout=10)


@pytest.mark.network
def test_a_record_already_on_the_index_is_kept_and_a_stale_one_is_named(tmp_path, htpasswd, login, make_wheel, caplog):
    wheelhouse = tmp_path / "wheelhouse"
    wheel = make_wheel(wheelhouse, "rocm-canary", "0.1.0+rocm9.9")
    write_record(wheel, "f" * 64, {"recipe": "rocm-canary"}, {"driver": "local"})
    packages = tmp_path / "packages"
    with running_pypiserver(packages, htpasswd) as server, caplog.at_level("WARNING", logger="rocwheels"):
        publish(wheelhouse, server.url)
        kept = record_path(packages / wheel.name).read_bytes()
        write_record(wheel, "e" * 64, {"recipe": "rocm-canary"}, {"driver": "local"})  # same bytes, other inputs
        publish(wheelhouse, server.url)
        assert record_path(packages / wheel.name).read_bytes() == kept
        assert "keeps the record it already has for these very bytes" in caplog.text

        (packages / wheel.name).unlink()  # removed from the index by hand, its record forgotten there
        rebuilt = make_wheel(wheelhouse, "rocm-canary", "0.1.0+rocm9.9", build="rebuilt")
        write_record(rebuilt, "d" * 64, {"recipe": "rocm-canary"}, {"driver": "local"})
        publish(wheelhouse, server.url)
    assert f"{record_path(wheel).name} on the index does not describe the wheel there" in caplog.text
