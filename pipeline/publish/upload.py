"""Upload the wheelhouse to a private index with twine: skip what is there, never replace a file.

Before uploading, the index's PEP 503 pages are read: a wheel already listed with the same sha256
is skipped, the same file name with another hash stops the run (an index must never serve two
different files under one name). Each wheel's provenance record then goes beside it, to
``<wheel URL>.provenance.json`` (an index started by ``rocwheels serve`` accepts it there, with the
upload login, only if it names that wheel's sha256); an index that takes no records gets the
wheels alone, with a warning: CI reuse from it is then off. Every wheel is verified first
(pipeline/publish/admission.py): one that fails is not uploaded, the others are. Credentials stay
twine's business (environment, ``.pypirc`` or keyring); a login written into the URL is taken out
of it and handed to twine in its environment, never on its command line, and the credentials
rocwheels can see are masked in every log line and message. Every call waits at most ``timeout``
seconds for the index (pipeline/util/net.py).
"""

from __future__ import annotations

import base64
import http.client
import logging
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.error import HTTPError, URLError
from urllib.parse import quote, unquote, urljoin, urlsplit
from urllib.request import (
    HTTPBasicAuthHandler,
    HTTPPasswordMgrWithDefaultRealm,
    OpenerDirector,
    Request,
    build_opener,
)

from twine.exceptions import InvalidConfiguration, UnreachableRepositoryURLDetected
from twine.utils import DEFAULT_CONFIG_FILE, get_repository_from_config

from pipeline.config.layout import Layout
from pipeline.errors import RocwheelsError
from pipeline.publish.admission import Refused, admit_wheels
from pipeline.publish.index import WheelFile, page_links
from pipeline.util.cmd import run
from pipeline.util.net import DEFAULT_TIMEOUT, TIMEOUT_ENV, split_login
from pipeline.verify.provenance import SUFFIX, Provenance, record_path

log = logging.getLogger("rocwheels")

_TWINE_AUTH_FAILURE = re.compile(r"HTTPError: (401|403)\b")
_TWINE_TRANSIENT = re.compile(
    r"Connection refused|Connection reset|Connection aborted|RemoteDisconnected|HTTPError: 5\d\d\b"
)
_TWINE_TIMEOUT = re.compile(r"timed out|Timeout", re.IGNORECASE)


@dataclass(frozen=True)
class Repository:
    """Where wheels go (twine's upload URL) and where the index lists what it holds (PEP 503)."""

    # how twine is told: --repository NAME or --repository-url URL (never with a login in it)
    twine_args: tuple[str, ...]
    upload_url: str  # without credentials: safe to show
    simple_url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # for reading an index that wants a login
    secrets: tuple[str, ...] = field(default=(), repr=False)  # every credential to mask in output
    # A login taken out of the URL, for twine's environment (TWINE_USERNAME, TWINE_PASSWORD).
    twine_env: dict[str, str] = field(default_factory=dict, repr=False)
    timeout: float = DEFAULT_TIMEOUT  # seconds any one call may wait for the index


@dataclass(frozen=True)
class PublishResult:
    repository_url: str
    uploaded: tuple[Path, ...]
    skipped: tuple[Path, ...]  # already on the index with the same sha256
    records: tuple[Path, ...] = ()  # provenance records on the index beside their wheels (sent now or before)
    records_refused: tuple[Path, ...] = ()  # records the index would not take (not a rocwheels serve index)
    refused: tuple[Refused, ...] = ()  # wheels that failed verify: not uploaded


@dataclass(frozen=True)
class _Listed:
    url: str  # the file's link on its project page, made absolute, without the #sha256 fragment
    sha256: str | None  # None when the page gives none


class _TransientError(Exception):
    """The index could not be reached or answered 5xx: worth another try after a pause."""


def resolve_repository(
    repository: str,
    *,
    config_file: Path | None = None,
    simple_url: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Repository:
    """Turn ``NAME`` (a ``.pypirc`` section) or ``URL`` into the upload and simple-index URLs.

    The simple index defaults to the upload URL with ``simple/`` in place of a trailing
    ``legacy/`` (pypiserver: ``http://host:port/`` -> ``http://host:port/simple/``); pass
    ``simple_url`` for servers laid out otherwise (devpi: ``.../+simple/``). A login in the URL
    (``http://user:password@host/``) is taken out of it: what ``ps`` shows of twine is the bare URL.
    """
    is_url = "://" in repository
    url_user = url_password = None
    if is_url:
        repository, url_user, url_password = split_login(repository)
    config_path = str(config_file) if config_file else DEFAULT_CONFIG_FILE
    try:
        config = get_repository_from_config(config_path, repository, repository if is_url else None)
    except (InvalidConfiguration, UnreachableRepositoryURLDetected) as exc:
        reason = str(exc).splitlines()[0]
        raise RocwheelsError(
            f"cannot use repository {repository!r}: {reason}",
            fix=f"pass the index's upload URL (e.g. http://127.0.0.1:8080/) or the NAME of a section "
            f"with repository= and username= in {config_path}",
        ) from None
    twine_args: tuple[str, ...] = ("--repository-url", repository) if is_url else ("--repository", repository)
    if config_file:
        twine_args += ("--config-file", str(config_file))
    # twine's own order: the environment wins over the URL's login and .pypirc
    username = os.environ.get("TWINE_USERNAME") or url_user or config.get("username")
    passwords = tuple(s for s in (os.environ.get("TWINE_PASSWORD"), url_password, config.get("password")) if s)
    twine_env = {}
    if url_user is not None and "TWINE_USERNAME" not in os.environ:
        twine_env["TWINE_USERNAME"] = url_user
    if url_password is not None and "TWINE_PASSWORD" not in os.environ:
        twine_env["TWINE_PASSWORD"] = url_password
    upload_url = str(config["repository"])
    return Repository(
        twine_args=twine_args,
        upload_url=upload_url,
        simple_url=simple_url or _simple_url_for(upload_url),
        username=username,
        password=passwords[0] if passwords else None,
        secrets=_masked_forms(username, passwords),
        twine_env=twine_env,
        timeout=timeout,
    )


def _masked_forms(username: str | None, passwords: tuple[str, ...]) -> tuple[str, ...]:
    """Each password as it may appear in output: itself, percent-encoded, and inside a Basic login header."""
    forms = []
    for password in passwords:
        forms += [password, quote(password, safe="")]
        if username:
            forms.append(base64.b64encode(f"{username}:{password}".encode()).decode())
    return tuple(dict.fromkeys(forms))


def publish(
    wheelhouse: Path,
    repository: str,
    *,
    project: Layout | None = None,
    config_file: Path | None = None,
    simple_url: str | None = None,
    attempts: int = 4,
    backoff_seconds: float = 2.0,
    timeout: float = DEFAULT_TIMEOUT,
) -> PublishResult:
    """Upload every wheel in ``wheelhouse`` that passes verify and the index does not hold yet.

    ``project`` (recipes and lock) describes the wheels and names the signing keys for that
    verify; without it each wheel gets the defaults. Unreachable servers, 5xx answers and calls
    unanswered after ``timeout`` seconds are retried ``attempts`` times in all, waiting
    ``backoff_seconds``, then twice that, and so on; each try reads the index again first, so a
    file that reached the server before a failure is not sent twice.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    if not any(wheelhouse.glob("*.whl")):
        raise RocwheelsError(
            f"no wheels to publish in {wheelhouse}",
            fix="build, repair and verify wheels first (verified wheels land in the wheelhouse)",
        )
    admission = admit_wheels(wheelhouse, project).require_some()
    wheels = admission.admitted
    repo = resolve_repository(repository, config_file=config_file, simple_url=simple_url, timeout=timeout)
    log_file = wheelhouse / "logs" / "publish.log"
    already_there: tuple[WheelFile, ...] | None = None  # what the index held before this run uploaded anything
    for attempt in range(1, attempts + 1):
        try:
            pending = _not_yet_published(wheels, repo)
            if already_there is None:
                already_there = tuple(w for w in wheels if w not in pending)
                for wheel in already_there:
                    log.info("%s: already on %s with the same sha256, skipped", wheel.path.name, repo.simple_url)
            if pending:
                _upload(pending, repo, log_file)
            records, refused = _publish_records(wheels, repo)
            break
        except _TransientError as exc:
            if attempt == attempts:
                raise RocwheelsError(
                    f"the package index is unreachable or failing: {exc} (gave up after {attempts} attempts)",
                    fix="check that the index server is running and reachable (a local one: rocwheels serve) and that "
                    "--repository names it, then publish again: wheels already on the index are skipped",
                ) from None
            delay = backoff_seconds * 2 ** (attempt - 1)
            log.warning("%s; retrying in %g s (attempt %d of %d)", exc, delay, attempt + 1, attempts)
            time.sleep(delay)
    assert already_there is not None  # set by the try that succeeded
    uploaded = tuple(w.path for w in wheels if w not in already_there)
    for path in uploaded:
        log.info("%s: uploaded to %s", path.name, repo.upload_url)
    return PublishResult(
        repo.upload_url, uploaded, tuple(w.path for w in already_there), records, refused, admission.refused
    )


def _simple_url_for(upload_url: str) -> str:
    base = upload_url if upload_url.endswith("/") else upload_url + "/"
    if base.endswith("/legacy/"):
        base = base[: -len("legacy/")]
    return base + "simple/"


def _not_yet_published(wheels: tuple[WheelFile, ...], repo: Repository) -> tuple[WheelFile, ...]:
    """The wheels the index does not list; fails if it lists one of them with other contents."""
    listed = _listed_files(repo, sorted({w.project for w in wheels}))
    problems = []
    for wheel in wheels:
        name = wheel.path.name
        if name not in listed:
            continue
        if listed[name].sha256 is None:
            problems.append(f"{name} is listed without a sha256, so it cannot be compared")
        elif listed[name].sha256 != wheel.sha256:
            problems.append(f"{name}: index sha256 {listed[name].sha256}, local sha256 {wheel.sha256}")
    if problems:
        raise RocwheelsError(
            f"{repo.simple_url} already holds files under these names with different contents: "
            + "; ".join(problems)
            + ". An index must not serve two builds under one file name.",
            fix="give the new build a new version or local label, or delete the old file from the index on purpose "
            "and publish again",
        )
    return tuple(w for w in wheels if w.path.name not in listed)


def _listed_files(repo: Repository, projects: list[str]) -> dict[str, _Listed]:
    """File name -> where and with which sha256 the index lists it, for every file of ``projects``."""
    opener = _index_opener(repo)
    _read_page(opener, repo.simple_url, repo.timeout)  # the index answers, and its simple root is where we think
    listed: dict[str, _Listed] = {}
    for project in projects:
        page_url = f"{repo.simple_url}{project}/"
        page = _read_page(opener, page_url, repo.timeout, missing_ok=True)
        if page is not None:
            listed.update(_file_links(page, page_url))
    return listed


def _publish_records(wheels: tuple[WheelFile, ...], repo: Repository) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """Put each wheel's provenance record at ``<wheel URL>.provenance.json``; (on the index now, refused).

    Run after the upload, so every wheel is listed. A record the index already holds is left
    alone; one the index holds differently (the same bytes built from other inputs) is kept there,
    as a wheel is never replaced. An index that takes no records at all (404, 405 or 501 to the
    PUT: not started by ``rocwheels serve``) gets none, with a warning saying what that costs.
    """
    with_records = [w for w in wheels if record_path(w.path).is_file()]
    if not with_records:
        return (), ()
    listed = _listed_files(repo, sorted({w.project for w in with_records}))
    opener = _index_opener(repo)
    on_index: list[Path] = []
    for number, wheel in enumerate(with_records):
        record = record_path(wheel.path)
        data = record.read_bytes()
        if wheel.path.name in listed:
            url = listed[wheel.path.name].url + SUFFIX
            there = _read(opener, url, repo.timeout, missing_ok=True)
            if there is not None:
                if there != data:
                    _warn_other_record(record.name, there, wheel.sha256, url)
                on_index.append(record)
                continue
            refusal = _put_record(opener, url, data, repo.timeout)
        else:
            refusal = (
                f"its simple page {repo.simple_url}{wheel.project}/ does not list {wheel.path.name} after the upload"
            )
        if refusal:
            refused = tuple(record_path(w.path) for w in with_records[number:])
            log.warning(
                "%s takes no provenance records (%s): %d wheel(s) published without them. Teammates cannot fetch what "
                "made these wheels, and CI reuse from this index (rocwheels ci / make wheels --from-index, "
                "ROCWHEELS_REUSE_INDEX) builds them again instead of taking them. Serve the index with rocwheels serve "
                "and publish again to add them.",
                repo.upload_url,
                refusal,
                len(refused),
            )
            return tuple(on_index), refused
        log.info("%s: published beside its wheel", record.name)
        on_index.append(record)
    return tuple(on_index), ()


def _warn_other_record(name: str, there: bytes, sha256: str, url: str) -> None:
    """The index holds another record for a wheel: say whether it still describes the wheel's bytes."""
    try:
        named = Provenance.parse(there).sha256
    except (ValueError, TypeError):
        named = None
    if named == sha256:
        log.warning(
            "%s: the index keeps the record it already has for these very bytes (built from other inputs); "
            "CI reuse compares against that one",
            name,
        )
    else:
        log.warning(
            "%s on the index does not describe the wheel there (%s): CI reuse will refuse this wheel. Remove "
            "the record from the index's packages folder and publish again",
            name,
            url,
        )


def _put_record(opener: OpenerDirector, url: str, data: bytes, timeout: float) -> str | None:
    """PUT one record; None when stored, the index's answer when it takes no records at all."""
    request = Request(url, data=data, method="PUT", headers={"Content-Type": "application/json"})
    try:
        with opener.open(request, timeout=timeout):
            return None
    except HTTPError as exc:
        reason = exc.read().decode("utf-8", "replace").strip() or exc.reason
        if exc.code in (404, 405, 501):
            return f"PUT {url} answered HTTP {exc.code} {exc.reason}"
        if exc.code >= 500:
            raise _TransientError(f"{url} answered HTTP {exc.code} {exc.reason}") from None
        if exc.code in (401, 403):
            raise RocwheelsError(
                f"the package index refused the login for provenance records at {url} (HTTP {exc.code})",
                fix="set TWINE_USERNAME and TWINE_PASSWORD (or username/password in .pypirc): "
                "rocwheels sends the records with the upload login, which it cannot read from "
                "keyring",
            ) from None
        raise RocwheelsError(
            f"the package index refused the provenance record {url}: {reason}",
            fix="the record must describe the very bytes of the wheel on the index: rebuild the wheel "
            "(rocwheels wheels ... --force), verify it and publish it under a new version",
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        raise _unreachable(url, exc, timeout) from None


def _index_opener(repo: Repository) -> OpenerDirector:
    """An HTTP client that answers a login challenge with the upload credentials, if rocwheels knows them."""
    if not (repo.username and repo.password):
        return build_opener()
    passwords = HTTPPasswordMgrWithDefaultRealm()
    # The pages under the simple URL; the files they link and their records under the upload URL (pypiserver).
    passwords.add_password(None, [repo.simple_url, repo.upload_url], repo.username, repo.password)
    return build_opener(HTTPBasicAuthHandler(passwords))


def _read_page(opener: OpenerDirector, url: str, timeout: float, *, missing_ok: bool = False) -> str | None:
    data = _read(opener, url, timeout, missing_ok=missing_ok)
    return None if data is None else data.decode("utf-8", "replace")


def _read(opener: OpenerDirector, url: str, timeout: float, *, missing_ok: bool = False) -> bytes | None:
    try:
        with opener.open(url, timeout=timeout) as response:
            body: bytes = response.read()
            return body
    except HTTPError as exc:
        if exc.code == 404 and missing_ok:
            return None
        if exc.code >= 500:
            raise _TransientError(f"{url} answered HTTP {exc.code} {exc.reason}") from None
        if exc.code in (401, 403):
            raise RocwheelsError(
                f"the package index refused to list its files at {url} (HTTP {exc.code} {exc.reason})",
                fix="set TWINE_USERNAME and TWINE_PASSWORD (or username/password in .pypirc): "
                "rocwheels reads the index with the upload login",
            ) from None
        raise RocwheelsError(
            f"{url} answered HTTP {exc.code} {exc.reason}: not a PEP 503 simple index",
            fix="pass the index's simple URL (--simple-url), e.g. http://host:port/simple/",
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        raise _unreachable(url, exc, timeout) from None


def _unreachable(url: str, exc: OSError | http.client.HTTPException, timeout: float) -> _TransientError:
    """A connection that failed (URLError is an OSError: refused, reset, timeout, DNS), worth another try."""
    reason = exc.reason if isinstance(exc, URLError) else exc
    if isinstance(reason, TimeoutError):
        return _TransientError(_no_answer(url, timeout))
    return _TransientError(f"{url}: {getattr(reason, 'strerror', None) or reason}")


def _no_answer(url: str, timeout: float) -> str:
    return f"{url}: no answer within {timeout:g} s (--timeout, {TIMEOUT_ENV})"


def _file_links(page: str, page_url: str) -> dict[str, _Listed]:
    """File name -> link and sha256 from a PEP 503 project page (anchors end in ``#sha256=<hex>``)."""
    files: dict[str, _Listed] = {}
    for href in page_links(page):
        link = urlsplit(href)
        algorithm, _, digest = link.fragment.partition("=")
        files[unquote(link.path.rsplit("/", 1)[-1])] = _Listed(
            urljoin(page_url, href.split("#", 1)[0]), digest.lower() if algorithm == "sha256" and digest else None
        )
    return files


def _upload(wheels: tuple[WheelFile, ...], repo: Repository, log_file: Path) -> None:
    log.info("uploading %d wheels to %s (twine output: %s)", len(wheels), repo.upload_url, log_file)
    result = run(
        [
            sys.executable,
            "-m",
            "pipeline.publish.twine_once",
            "--no-color",
            "upload",
            "--non-interactive",
            "--disable-progress-bar",
            *repo.twine_args,
            *(w.path for w in wheels),
        ],
        # The login from the URL and the time limit reach twine through its environment only.
        env={**repo.twine_env, TIMEOUT_ENV: str(repo.timeout)},
        log_file=log_file,
        check=False,
        redact=repo.secrets,
    )
    if result.returncode == 0:
        return
    output = result.output
    flat = " ".join(output.split())  # twine wraps its messages at 80 columns: match across line breaks
    if match := _TWINE_AUTH_FAILURE.search(flat):
        raise RocwheelsError(
            f"the package index at {repo.upload_url} rejected the upload login (HTTP {match.group(1)})",
            fix="check the username and password twine uses: TWINE_USERNAME/TWINE_PASSWORD, the repository's "
            "section in .pypirc, or keyring; for an index started by rocwheels serve, set the password with "
            "rocwheels index add-user",
        )
    if "Credential not found" in flat:
        raise RocwheelsError(
            f"no login for {repo.upload_url}: twine found no username or password",
            fix="set TWINE_USERNAME and TWINE_PASSWORD, or username/password in the repository's .pypirc section, "
            "or store the password in keyring",
        )
    if match := _TWINE_TRANSIENT.search(flat):
        raise _TransientError(f"upload to {repo.upload_url} failed: {match.group(0)}")
    if _TWINE_TIMEOUT.search(flat):
        raise _TransientError(f"upload to {_no_answer(repo.upload_url, repo.timeout)}")
    errors = [line.strip() for line in output.splitlines() if "ERROR" in line] or output.strip().splitlines()[-1:]
    raise RocwheelsError(
        f"twine could not upload to {repo.upload_url}: {' '.join(errors)} (log: {log_file})",
        fix=f"read {log_file}; rerun with the same command once fixed: uploaded wheels are skipped",
    )


def listed_wheels(simple_url: str, timeout: float = DEFAULT_TIMEOUT) -> dict[str, str]:
    """File name -> sha256 of every wheel a PEP 503 index lists, across all its projects (``index build
    --index-url``). The index is read with the upload login from the environment, if any."""
    root = simple_url if simple_url.endswith("/") else simple_url + "/"
    repo = Repository(
        twine_args=(),
        upload_url=root,
        simple_url=root,
        username=os.environ.get("TWINE_USERNAME"),
        password=os.environ.get("TWINE_PASSWORD"),
        timeout=timeout,
    )
    try:
        page = _read_page(_index_opener(repo), root, timeout) or ""
        projects = sorted({unquote(urlsplit(href).path.rstrip("/").rsplit("/", 1)[-1]) for href in page_links(page)})
        listed = _listed_files(repo, projects)
    except _TransientError as exc:
        raise RocwheelsError(
            f"the package index is unreachable or failing: {exc}",
            fix="check that the index is running and that --index-url is its simple root (http://host:8080/simple/)",
        ) from None
    wheels = {name: file for name, file in listed.items() if name.endswith(".whl")}
    unhashed = sorted(name for name, file in wheels.items() if file.sha256 is None)
    if unhashed:
        raise RocwheelsError(
            f"{root} lists {', '.join(unhashed)} without a #sha256= fragment: their hashes cannot be pinned",
            fix="serve the index with rocwheels serve (pypiserver --hash-algo sha256) or another index that lists sha256",
        )
    return {name: file.sha256 for name, file in wheels.items() if file.sha256}
