"""What ``rocwheels serve`` makes from the wheels pypiserver holds, as ``index build`` does for a wheelhouse.

- ``/pins/constraints-<line>.txt`` and ``/pins/requirements-<line>.txt``: each line's pin files
  (``pip install -c URL``, ``pip install --require-hashes -r URL``); ``/pins/`` lists them.
- ``/packages/{name}-{version}-variants.json``: a release's variant wheels' variant.json merged.
- ``/simple/<project>/``: pypiserver's page plus a link to each such variants.json (PEP 825 wants the
  project page to link it; pypiserver lists distributions only).

All of it is computed with publish/index.py's functions from the packages folder as it is at the
request: each wheel is read and hashed once, and again only when its size or modification time
changes, so an upload, a removal or a file copied in by hand shows in the very next answer. The
pins follow each project's newest release per line: a team index keeps every version it was given.
"""

from __future__ import annotations

import hashlib
import html
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pipeline.errors import RocwheelsError
from pipeline.publish.index import (
    LineSettings,
    WheelFile,
    label_lines,
    newest_releases,
    pin_files,
    variant_releases,
    wheel_file,
)
from pipeline.wheel.variant import merge_variants_json

# How `rocwheels serve` hands the lock's line settings (label aliases, ROCm pins) to the server process.
log = logging.getLogger("rocwheels")

LINE_SETTINGS_VARIABLE = "ROCWHEELS_LINE_SETTINGS"
PINS_PREFIX = "/pins/"
_VARIANTS_JSON = re.compile(r"/packages/([^/]+-variants\.json)")
_PROJECT_PAGE = re.compile(r"/simple/([^/]+)/")

StartResponse = Callable[..., Any]
# (status, text, extra headers) when a login is missing or wrong for an action; None when allowed
LoginCheck = Callable[[dict[str, Any], str], "tuple[int, str, list[tuple[str, str]]] | None"]


class ServedFiles:
    """WSGI middleware: pin files and variants.json from the served wheels, everything else to ``app``."""

    def __init__(self, app: Callable[..., Iterable[bytes]], config: Any, login_refusal: LoginCheck) -> None:
        self.app = app
        self.config = config
        self.login_refusal = login_refusal
        settings = os.environ.get(LINE_SETTINGS_VARIABLE)
        self.settings = LineSettings.from_json(settings) if settings else LineSettings({}, {})
        self._known: dict[Path, tuple[tuple[int, int], WheelFile]] = {}
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace")
        variants_json = _VARIANTS_JSON.fullmatch(path)
        project_page = _PROJECT_PAGE.fullmatch(path)
        if not (path.startswith(PINS_PREFIX) or variants_json or project_page):
            return self.app(environ, start_response)
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            if project_page:
                return self.app(environ, start_response)
            return _answer(
                start_response, method, 405, f"{method} is not allowed here\n", headers=[("Allow", "GET, HEAD")]
            )
        if project_page:
            return self._project_page(environ, start_response, project_page[1])
        try:
            refusal = self.login_refusal(environ, "download")
            if refusal:
                status, text, headers = refusal
                return _answer(start_response, method, status, text, headers=headers)
            if variants_json:
                return self._variants_json(start_response, method, variants_json[1])
            return self._pin_file(start_response, method, path[len(PINS_PREFIX) :])
        except RocwheelsError as exc:
            # A damaged file in the packages folder: say which, rather than serve pins that leave it out.
            return _answer(start_response, method, 500, f"{exc}\nfix: {exc.fix}\n")

    def wheels(self) -> tuple[WheelFile, ...]:
        """Every wheel in the packages folder now, read again only when it changed."""
        with self._lock:
            current: dict[Path, tuple[tuple[int, int], WheelFile]] = {}
            for package in self.config.backend.get_all_packages():
                path = Path(package.fn)
                if path.suffix != ".whl":
                    continue
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue  # removed since it was listed
                key = (stat.st_size, stat.st_mtime_ns)
                known = self._known.get(path)
                current[path] = known if known and known[0] == key else (key, wheel_file(path))
            self._known = current
            return tuple(wheel for _key, wheel in sorted(current.values(), key=lambda item: item[1].path.name))

    def _pin_file(self, start_response: StartResponse, method: str, name: str) -> list[bytes]:
        lines = newest_releases(label_lines(self.wheels(), self.settings.aliases))
        files = pin_files(lines, rocm_pins=self.settings.rocm_pins)
        if name in files:
            return _answer(start_response, method, 200, files[name])
        if name == "":
            return _answer(start_response, method, 200, "".join(f"{file}\n" for file in sorted(files)))
        held = ", ".join(sorted(files)) or "none: no wheel with a +rocmX.Y label is here yet"
        return _answer(start_response, method, 404, f"no pin file {name} on this index; it has {held}\n")

    def _variants_json(self, start_response: StartResponse, method: str, name: str) -> list[bytes]:
        releases = {path.name: variants for path, variants in variant_releases(self.wheels()).items()}
        if name not in releases:
            return _answer(start_response, method, 404, f"no variant wheels of the release {name} on this index\n")
        return _answer(start_response, method, 200, merge_variants_json(releases[name]), "application/json")

    def _variants_anchors(self, project: str) -> str:
        ours = [w for w in self.wheels() if w.project == project]
        anchors = []
        for path, variants in variant_releases(ours).items():
            sha256 = hashlib.sha256(merge_variants_json(variants).encode("utf-8")).hexdigest()
            anchors.append(
                f'<a href="../../packages/{quote(path.name)}#sha256={sha256}">{html.escape(path.name)}</a><br>\n'
            )
        return "".join(anchors)

    def _project_page(self, environ: dict[str, Any], start_response: StartResponse, project: str) -> Iterable[bytes]:
        """pypiserver's page for ``project`` with a link to each of its releases' variants.json."""
        answer: list[Any] = []

        def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
            answer[:] = [status, headers]
            return lambda data: None  # pypiserver (bottle) returns its body rather than writing it

        result = self.app(environ, keep)
        try:
            body = b"".join(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        status, headers = answer
        try:
            anchors = self._variants_anchors(project).encode("utf-8") if status.startswith("200") else b""
        except RocwheelsError as exc:
            # The wheels stay installable; only the variants link waits for the damaged file to go.
            log.error("variants.json links left off the page of %s: %s", project, exc)
            anchors = b""
        if anchors and b"</body>" in body:
            body = body.replace(b"</body>", anchors + b"</body>", 1)
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers.append(("Content-Length", str(len(body))))
        start_response(status, headers)
        return [body]


def _answer(
    start_response: StartResponse,
    method: str,
    status: int,
    text: str,
    content_type: str = "text/plain; charset=utf-8",
    headers: list[tuple[str, str]] | None = None,
) -> list[bytes]:
    body = text.encode("utf-8")
    start_response(
        f"{status} {HTTPStatus(status).phrase}",
        [("Content-Type", content_type), ("Content-Length", str(len(body))), *(headers or [])],
    )
    return [b"" if method == "HEAD" else body]
