"""Network calls to an index: each with a time limit, logins kept out of URLs shown or passed on.

An index that accepts a connection and never answers would hold publish or reuse forever: every
call waits at most ``ROCWHEELS_NETWORK_TIMEOUT`` seconds (``--timeout``) for the next bytes. It
bounds each wait, not a whole transfer, so a multi-GB wheel still uploads over a slow link.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit, urlunsplit

from pipeline.errors import InputError

TIMEOUT_ENV = "ROCWHEELS_NETWORK_TIMEOUT"
DEFAULT_TIMEOUT = 60.0


def network_timeout() -> float:
    """``ROCWHEELS_NETWORK_TIMEOUT`` in seconds (for callers without a ``--timeout`` option)."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise InputError(
            f"{TIMEOUT_ENV}={text!r} is not a number of seconds", fix=f"set it to e.g. {DEFAULT_TIMEOUT:g}"
        )
    return seconds


def split_login(url: str) -> tuple[str, str | None, str | None]:
    """(the URL without ``user:password@``, user, password), both percent-decoded: the login travels
    apart from the URL, so no command line, log line or message shows it."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None, None
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    clean = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    return clean, user, password
