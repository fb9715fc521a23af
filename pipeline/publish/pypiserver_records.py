"""pypiserver with each wheel's provenance record beside it: ``python -m pipeline.publish.pypiserver_records run ...``.

pypiserver lists, serves and accepts distributions only: an upload whose name is not one is
refused, and a file it does not list is not served. rocwheels' CI reuse and teammates need
``<wheel URL>.provenance.json`` beside every wheel, as the static index has it. So this runs
pypiserver's own command line with its WSGI app wrapped: requests for
``/packages/<wheel>.provenance.json`` are answered here (GET: the record lying beside the wheel;
PUT: store one, behind the same login and ``--authenticate`` rules as pypiserver's uploads), and
everything else reaches pypiserver unchanged. A record is stored only when it names the wheel the
index holds and that file's sha256, and never replaces another.

Uploads are made atomic here too. pypiserver writes an upload straight under its final name, so
an upload cut short (Ctrl-C or SIGKILL of twine, a dropped connection) left a truncated wheel
that the index listed and served, and that made every later publish fail as "different
contents". Its file writer is replaced: the upload goes to a hidden temporary file (pypiserver
lists no dot file), is hashed on the way, and gets its final name only when complete and its
sha256 is the ``sha256_digest`` the client sent (twine always sends it); otherwise the client
gets HTTP 400 and nothing is listed. Temporary files of a server that was killed are removed
when the next one starts.

The pypiserver internals used here (``setup_routes_from_config``, ``config.authenticate``,
``config.auther``, ``config.backend``, ``backend.write_file``, bottle's ``request``) were read in
pypiserver 2.4.2 (pypiserver/__init__.py, config.py, _app.py, backend.py); tests/test_serve.py
runs them for real.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

import pypiserver
import pypiserver.backend
from pypiserver.__main__ import main
from pypiserver.bottle_wrapper import HTTPError, request

from pipeline.publish.serve import UPLOAD_PREFIX
from pipeline.publish.served_files import ServedFiles
from pipeline.util.files import atomic_write, file_sha256
from pipeline.verify.provenance import SUFFIX, Provenance

_PREFIX = "/packages/"
_MAX_RECORD_BYTES = 1 << 20  # a record is a few kB; refuse anything that is clearly not one
_setup_routes = pypiserver.setup_routes_from_config
_CHUNK = 1 << 20

StartResponse = Callable[..., Any]


class ProvenanceRecords:
    """WSGI middleware: provenance records beside pypiserver's wheels, everything else to pypiserver."""

    def __init__(self, app: Callable[..., Iterable[bytes]], config: Any) -> None:
        self.app = app
        self.config = config

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        # WSGI hands the path over as latin-1 text of the raw bytes; file names are UTF-8.
        path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace")
        if not (path.startswith(_PREFIX) and path.endswith(SUFFIX)):
            return self.app(environ, start_response)
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD", "PUT"):
            return _answer(
                start_response, 405, f"{method} is not allowed on a provenance record\n", [("Allow", "GET, HEAD, PUT")]
            )
        refusal = self._login_refusal(environ, "update" if method == "PUT" else "download")
        if refusal:
            return _answer(start_response, *refusal)
        wheel_name = path[len(_PREFIX) : -len(SUFFIX)]
        wheel = next(
            (
                Path(pkg.fn)
                for pkg in self.config.backend.get_all_packages()
                if pkg.relfn_unix == wheel_name and wheel_name.endswith(".whl")
            ),
            None,
        )
        if wheel is None:
            return _answer(start_response, 404, f"no wheel {wheel_name} on this index: upload the wheel first\n")
        record = wheel.with_name(wheel.name + SUFFIX)
        if method == "PUT":
            return _answer(start_response, *_store(record, wheel, _body(environ)))
        if not record.is_file():
            return _answer(start_response, 404, f"no provenance record for {wheel_name} on this index\n")
        data = record.read_bytes()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [b"" if method == "HEAD" else data]

    def _login_refusal(self, environ: dict[str, Any], action: str) -> tuple[int, str, list[tuple[str, str]]] | None:
        """pypiserver's own rule: an action it was told to --authenticate needs a user of its htpasswd."""
        if action not in self.config.authenticate:
            return None
        scheme, _, encoded = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            user = password = ""
        if scheme.lower() != "basic" or not user:
            return 401, "a login is needed\n", [("WWW-Authenticate", 'Basic realm="pypi"')]
        if not self.config.auther(user, password):
            return 403, "wrong user name or password\n", []
        return None


def _body(environ: dict[str, Any]) -> bytes | None:
    """The request body, or None when it is missing or too large to be a record."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or -1)
    except ValueError:
        return None
    if not 0 < length <= _MAX_RECORD_BYTES:
        return None
    body: bytes = environ["wsgi.input"].read(length)
    return body


def _store(record: Path, wheel: Path, data: bytes | None) -> tuple[int, str]:
    """Write ``record`` beside ``wheel`` if ``data`` is a record of exactly that file; (status, reason)."""
    if data is None:
        return 400, f"send the record as the request body (at most {_MAX_RECORD_BYTES} bytes)\n"
    try:
        provenance = Provenance.parse(data)
    except (ValueError, TypeError) as exc:
        return 400, f"not a provenance record ({exc})\n"
    if provenance.wheel != wheel.name:
        return 409, f"the record describes {provenance.wheel}, not {wheel.name}\n"
    actual = file_sha256(wheel)
    if provenance.sha256 != actual:
        return 409, (
            f"the record's sha256 {provenance.sha256} is not the sha256 {actual} of {wheel.name} on this index: "
            "it describes other bytes\n"
        )
    if record.is_file():
        if record.read_bytes() == data:
            return 200, "the same record is already here\n"
        return 409, f"another record for {wheel.name} is already here; records are never replaced\n"
    # A dot name: pypiserver lists no hidden file, and readers see the whole record or none.
    with atomic_write(record, mode=0o644) as pending:
        pending.write(data)
    return 201, f"stored {record.name}\n"


def _answer(
    start_response: StartResponse, status: int, text: str, headers: list[tuple[str, str]] | None = None
) -> list[bytes]:
    reasons = {
        200: "OK",
        201: "Created",
        400: "Bad Request",
        401: "Unauthorized",
        403: "Forbidden",
        404: "Not Found",
        405: "Method Not Allowed",
        409: "Conflict",
    }
    body = text.encode("utf-8")
    start_response(
        f"{status} {reasons[status]}",
        [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))), *(headers or [])],
    )
    return [body]


def _with_records(app: Any, config: Any) -> ServedFiles:
    records = ProvenanceRecords(_setup_routes(app, config), config)
    # Pin files and variants.json behind the same login rules as the records.
    return ServedFiles(records, config, records._login_refusal)


def store_upload(stream: BinaryIO, destination: Path | str) -> None:
    """pypiserver's ``write_file`` for uploads: all or nothing, and only the bytes the client hashed."""
    destination = Path(destination)
    expected = str(request.forms.get("sha256_digest") or "").strip().lower()
    if not expected:
        raise HTTPError(
            400, "send the file's sha256 as sha256_digest (twine does): uploads are checked before they are listed\n"
        )
    pending = destination.with_name(f"{UPLOAD_PREFIX}{os.getpid()}-{os.urandom(4).hex()}-{destination.name}")
    digest = hashlib.sha256()
    try:
        with pending.open("xb") as sink:
            for chunk in iter(lambda: stream.read(_CHUNK), b""):
                digest.update(chunk)
                sink.write(chunk)
        os.chmod(pending, 0o644)
        if not hmac.compare_digest(digest.hexdigest(), expected):
            raise HTTPError(
                400,
                f"{destination.name}: the received file's sha256 {digest.hexdigest()} is not the sha256_digest "
                f"{expected} the client sent (an upload cut short?): not stored, publish again\n",
            )
        try:
            os.link(pending, destination)  # fails if the name exists: a file on the index is never replaced
        except FileExistsError:
            raise HTTPError(409, f"{destination.name} is already on this index; files are never replaced\n") from None
    finally:
        pending.unlink(missing_ok=True)


pypiserver.setup_routes_from_config = _with_records
pypiserver.backend.write_file = store_upload

if __name__ == "__main__":
    sys.exit(main())
