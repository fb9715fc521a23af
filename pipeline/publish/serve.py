"""A private index for the team: a real pypiserver over a packages folder, uploads behind htpasswd.

Each wheel's provenance record is served and accepted beside it (pipeline/publish/pypiserver_records.py),
as on the static index: ``<wheel URL>.provenance.json``; each line's pin files and each release's
variants.json are made from the packages folder (pipeline/publish/served_files.py).

pypiserver runs for as long as the index is wanted, so it is started with ``subprocess.Popen``
rather than :func:`pipeline.util.cmd.run` (which waits for its command to end); the command is still
logged as ``+ command`` first.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

from passlib.apache import HtpasswdFile

from pipeline.errors import InputError, RocwheelsError
from pipeline.publish.index import LineSettings
from pipeline.publish.served_files import LINE_SETTINGS_VARIABLE
from pipeline.util.files import atomic_write

log = logging.getLogger("rocwheels")

# sha256-crypt: verified by pypiserver through passlib, stronger than htpasswd's MD5 default,
# and needs no extra package (passlib's bcrypt wants the bcrypt module).
_HTPASSWD_SCHEME = "sha256_crypt"
_STOP_TIMEOUT = 10  # seconds between SIGTERM and SIGKILL
_WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
_USERNAME = re.compile(r"[A-Za-z0-9._@+-]+")
# Uploads being received (pipeline/publish/pypiserver_records.py): hidden, so never listed, and
# named with the receiving server's pid, so a later server knows which ones were left by a dead one.
UPLOAD_PREFIX = ".rocwheels-upload-"


@dataclass(frozen=True)
class RunningIndex:
    url: str  # where twine uploads (rocwheels publish --repository URL)
    simple_url: str  # what pip reads (--extra-index-url)
    process: subprocess.Popen[bytes] = field(repr=False, compare=False)


def add_htpasswd_user(htpasswd: Path, username: str, password: str) -> None:
    """Create ``htpasswd`` if needed and set ``username``'s password in it (readable by its owner only).

    Everything is checked before the file is touched: a refused name never leaves an empty file
    that ``serve`` would then start with.
    """
    if not _USERNAME.fullmatch(username):
        raise InputError(
            f"user name {username!r} cannot be stored in an htpasswd file",
            fix="use letters, digits and . _ @ + - only (no ':' or spaces)",
        )
    if not password:
        raise InputError("the password is empty", fix="give a password (or set ROCWHEELS_INDEX_PASSWORD)")
    new = not htpasswd.exists()
    users = _load_htpasswd(htpasswd) if not new else HtpasswdFile(new=True, default_scheme=_HTPASSWD_SCHEME)
    users.set_password(username, password)
    htpasswd.parent.mkdir(parents=True, exist_ok=True)
    # Private from the first byte written, then one rename: a reader sees the old file or the new one.
    with atomic_write(htpasswd, mode=0o600) as stream:
        stream.write(users.to_string())
    log.info("%s: password set for %s", htpasswd, username)


def _load_htpasswd(htpasswd: Path) -> HtpasswdFile:
    try:
        users = HtpasswdFile(str(htpasswd), default_scheme=_HTPASSWD_SCHEME)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise InputError(
            f"{htpasswd} is not a readable htpasswd file ({exc})",
            fix=f"remove it and create the users again: rocwheels index add-user NAME --htpasswd {htpasswd}",
        ) from None
    return users


def serve(
    packages: Path,
    htpasswd: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    log_file: Path | None = None,
    lines: LineSettings | None = None,
) -> None:
    """Run pypiserver in the foreground until interrupted, then stop it.

    Ctrl-C and SIGTERM (kill, systemd, container stop) unwind through ``running_pypiserver``,
    which stops pypiserver: the command line's signal policy (pipeline/util/interrupts.py) turns
    both into an exception, so the server never outlives rocwheels on its port.
    """
    with running_pypiserver(packages, htpasswd, host=host, port=port, log_file=log_file, lines=lines) as index:
        where = f"; its log: {log_file}" if log_file else ""
        log.info(
            "serving %s: upload with rocwheels publish --repository %s, install with --extra-index-url %s "
            "(Ctrl-C stops%s)",
            packages,
            index.url,
            index.simple_url,
            where,
        )
        returncode = index.process.wait()
    raise RocwheelsError(
        f"pypiserver stopped by itself with exit code {returncode}",
        fix=f"see {log_file}" if log_file else "see its output above",
    )


@contextmanager
def running_pypiserver(
    packages: Path,
    htpasswd: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    log_file: Path | None = None,
    startup_timeout: float = 30.0,
    lines: LineSettings | None = None,
) -> Iterator[RunningIndex]:
    """Start pypiserver (``port=0``: a free one), wait until it answers, and stop it on exit.

    Uploads need a login from ``htpasswd``; listing and downloads are open. Unknown projects are not
    redirected to PyPI (``--disable-fallback``): a private index must answer only for itself. The
    server's output goes to ``log_file`` (the terminal when None). ``lines`` (the lock's label aliases
    and ROCm pins) go into the pin files it serves.
    """
    if not htpasswd.is_file():
        raise InputError(
            f"no htpasswd file at {htpasswd}: pypiserver would accept no upload",
            fix=f"create a user first: rocwheels index add-user NAME --htpasswd {htpasswd}",
        )
    if not _load_htpasswd(htpasswd).users():
        raise InputError(
            f"{htpasswd} holds no user: pypiserver would accept no upload",
            fix=f"create a user: rocwheels index add-user NAME --htpasswd {htpasswd}",
        )
    if packages.exists() and not packages.is_dir():
        raise InputError(f"--packages {packages} is a file, not a folder", fix="give the folder the index serves")
    probe_host = _WILDCARD_HOSTS.get(host, host)
    port = _bindable_port(host, probe_host, port)
    packages.mkdir(parents=True, exist_ok=True)
    _remove_stale_uploads(packages)
    url = f"http://{_url_host(probe_host)}:{port}/"
    # pypiserver's own command line, with provenance records served and accepted beside the wheels.
    argv = [
        sys.executable,
        "-m",
        "pipeline.publish.pypiserver_records",
        *pypiserver_run(host, port, htpasswd, packages),
    ]
    log.info("+ %s", shlex.join(argv))
    sink = None
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        sink = log_file.open("a", encoding="utf-8")
    env = {**os.environ, LINE_SETTINGS_VARIABLE: (lines or LineSettings({}, {})).to_json()}
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT if sink else None, env=env
    )
    try:
        _wait_until_answering(process, url, startup_timeout, log_file)
        yield RunningIndex(url, url + "simple/", process)
    finally:
        _stop(process)
        if sink is not None:
            sink.close()


def pypiserver_run(host: str, port: int, htpasswd: Path, packages: Path) -> list[str]:
    """pypiserver's ``run`` command for a team index: uploads only by a user of ``htpasswd``, no
    fallback to PyPI for names it lacks, sha256 in every link."""
    return [
        "run",
        *("--host", host, "--port", str(port), "--passwords", str(htpasswd), "--authenticate", "update"),
        *("--disable-fallback", "--hash-algo", "sha256", str(packages)),
    ]


def _remove_stale_uploads(packages: Path) -> None:
    """What uploads to a server that was killed left: only our own names, of processes that are gone."""
    for leftover in packages.glob(f"{UPLOAD_PREFIX}*"):
        pid = leftover.name[len(UPLOAD_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            log.info("removing %s, left by an upload to a server that was stopped", leftover)
            leftover.unlink(missing_ok=True)


def _bindable_port(host: str, probe_host: str, port: int) -> int:
    """``port`` (0: a free one) after checking that ``host`` resolves and the port is free there.

    pypiserver answers these mistakes with a traceback; checked here they get a plain message.
    """
    try:
        family = socket.getaddrinfo(probe_host, port or None, type=socket.SOCK_STREAM)[0][0]
    except (socket.gaierror, UnicodeError) as exc:
        raise InputError(
            f"--host {host!r} does not resolve to an address of this machine ({exc})",
            fix="use 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or this machine's name",
        ) from None
    except OverflowError:
        raise InputError(f"--port {port} is not a port number", fix="use 1 to 65535") from None
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((probe_host if host not in _WILDCARD_HOSTS else host or "0.0.0.0", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise RocwheelsError(
                    f"port {port} on {host} is already in use",
                    fix="stop the program using it, or choose another --port",
                ) from None
            raise InputError(
                f"cannot listen on {host}:{port}: {exc.strerror}",
                fix="use an address of this machine (127.0.0.1, 0.0.0.0) and a port you may open "
                "(1024 and up without root)",
            ) from None
        bound: int = probe.getsockname()[1]
        return bound


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _wait_until_answering(process: subprocess.Popen[bytes], url: str, timeout: float, log_file: Path | None) -> None:
    deadline = time.monotonic() + timeout
    where = f" (log: {log_file})" if log_file else ""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            said = f": {_last_line(log_file)}" if log_file else ""
            raise RocwheelsError(
                f"pypiserver exited with code {process.returncode} before answering at {url}{said}{where}",
                fix="read its log: a port already in use or an unreadable htpasswd file are the usual causes",
            )
        try:
            with urlopen(url + "health", timeout=1):
                return
        except (URLError, OSError):
            time.sleep(0.1)
    raise RocwheelsError(
        f"pypiserver did not answer at {url} within {timeout:.0f} s{where}",
        fix="read its output; on a slow machine allow a longer startup",
    )


def _last_line(log_file: Path) -> str:
    """The last line pypiserver wrote (the exception's own message, without its traceback)."""
    lines = [line for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
