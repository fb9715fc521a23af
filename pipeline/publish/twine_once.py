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

import requests
import twine.repository
from requests.adapters import HTTPAdapter
from twine.__main__ import main
from twine.package import PackageFile
from twine.repository import Repository
from twine.utils import make_requests_session

from pipeline.util.net import network_timeout

_upload = Repository.upload


def _session_without_retries() -> requests.Session:
    session = make_requests_session()
    for scheme in ("http://", "https://"):
        session.mount(scheme, HTTPAdapter(max_retries=0))
    session.request = functools.partial(session.request, timeout=network_timeout())  # type: ignore[method-assign]
    return session


def _upload_once(self: Repository, package: PackageFile, max_redirects: int = 1) -> requests.Response:
    return _upload(self, package, max_redirects=1)


# Repository looks the name up in its own module.
twine.repository.make_requests_session = _session_without_retries
# twine's upload command builds its Repository itself: the class is the one place to change.
Repository.upload = _upload_once  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
