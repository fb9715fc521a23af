"""twine with its own retries turned off and a time limit: ``python -m pipeline.publish.twine_once upload ...``.

twine retries on its own (five POSTs per file on a 5xx answer, urllib3 retries on refused
connections); rocwheels' publish retries too, reading the index first so a file that arrived is
not sent again. Retries inside retries sent a multi-GB wheel up to 20 times: here only
publish decides. twine sets no timeout, so an index that never answers held it forever: each of
its requests waits at most ``ROCWHEELS_NETWORK_TIMEOUT`` seconds for the next bytes. twine's
internals are bounded by the version range in pyproject.toml.
"""

from __future__ import annotations

import functools
import sys

import twine.repository
from requests.adapters import HTTPAdapter
from twine.__main__ import main

from pipeline.util.net import network_timeout

_make_session = twine.repository.make_requests_session


def _session_without_retries():
    session = _make_session()
    for scheme in ("http://", "https://"):
        session.mount(scheme, HTTPAdapter(max_retries=0))
    session.request = functools.partial(session.request, timeout=network_timeout())  # type: ignore[method-assign]
    return session


twine.repository.make_requests_session = _session_without_retries
twine.repository.Repository.upload = functools.partialmethod(twine.repository.Repository.upload, max_redirects=1)

if __name__ == "__main__":
    sys.exit(main())
