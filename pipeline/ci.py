"""CI: a lock line's recipe x Python jobs in dependency stages, and wheels reused from the team's index.

The matrix is read from the plan document (``rocwheels plan --json``), never worked out again, so
the jobs a CI runs and what ``make wheels`` would build cannot disagree. A recipe's stage is one
after the latest stage of what it depends on: torch first; torchvision, torchaudio and triton
next; then flash-attention; then vLLM. Each job builds one recipe for one Python and keeps its
wheels (``wheelhouse/<distribution>-<version>-*``, their provenance records and the recipe's
log) as an artifact; a later job gets the artifacts of the same Python's earlier jobs, finds
those wheels up to date by their provenance and builds only its own recipe.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from packaging.utils import InvalidWheelFilename

from pipeline.config.layout import Layout
from pipeline.config.lock import trusted_keys
from pipeline.config.recipes import LOCK_FILE
from pipeline.config.toolchain import python_tag
from pipeline.errors import RocwheelsError
from pipeline.plan import Plan
from pipeline.publish.index import page_links
from pipeline.publish.upload import resolve_repository
from pipeline.util.files import file_sha256
from pipeline.util.log import RecipeLogger, recipe_logger
from pipeline.util.net import DEFAULT_TIMEOUT, TIMEOUT_ENV
from pipeline.verify.provenance import SUFFIX, Provenance, fingerprints, is_current, record_path
from pipeline.verify.signing import Trust
from pipeline.verify.verify import Expectations, verify_wheel
from pipeline.wheel.archive import parse_wheel_name

log = logging.getLogger("rocwheels")

# The stage jobs .github/workflows/wheels.yml declares (GitHub Actions cannot add jobs at run
# time); the GitLab child pipeline has as many stages as the plan needs.
GITHUB_STAGES = 4
# Runner tags of the generated GitLab jobs, as the labels of the GitHub template's jobs: any Linux
# x86_64 runner for publishing, one with the tag `rocm` for builds.
RUNNER_TAGS = ("linux", "x64")
BUILD_TAGS = (*RUNNER_TAGS, "rocm")
# Every generated job names its image: the variable .gitlab-ci.yml sets (a shell runner ignores it).
JOB_IMAGE = "$ROCWHEELS_CI_IMAGE"
# Publishing reads and uploads files: minutes however large the wheels.
PUBLISH_TIMEOUT_MINUTES = 30


@dataclass(frozen=True)
class Job:
    """One recipe built for one Python version."""

    recipe: str
    distribution: str
    wheel_version: str
    python: str
    arch: str  # the GPU targets this recipe builds for: the requested ones its recipe supports
    stage: int  # 1 for recipes depending on nothing
    needs: tuple[str, ...]  # every recipe (direct or not) whose wheels the build installs
    timeout_minutes: int  # the recipe's [build] timeout_minutes

    @property
    def name(self) -> str:
        return f"{self.recipe} py{self.python}"

    @property
    def artifacts(self) -> tuple[str, ...]:
        """What the job keeps: its wheels with their provenance records, and its log."""
        return (f"wheelhouse/{self.distribution}-{self.wheel_version}-*", f"wheelhouse/logs/{self.recipe}.log")


@dataclass(frozen=True)
class Matrix:
    line: str
    targets: tuple[str, ...]
    driver: str
    stages: tuple[tuple[Job, ...], ...]
    notes: tuple[str, ...] = ()  # recipes built for fewer targets than asked, or left out

    @property
    def jobs(self) -> tuple[Job, ...]:
        return tuple(job for stage in self.stages for job in stage)


def ci_matrix(document: Mapping[str, Any]) -> Matrix:
    """The jobs of a plan document (``plan_document``), stage by stage."""
    stage: dict[str, int] = {}
    needs: dict[str, tuple[str, ...]] = {}
    for step in document["steps"]:  # dependencies first: the plan's order
        deps = step["depends_on"]
        stage[step["name"]] = 1 + max((stage[d] for d in deps), default=0)
        needs[step["name"]] = tuple(dict.fromkeys(n for d in deps for n in (*needs[d], d)))
    jobs = [
        Job(
            step["name"],
            step["distribution"],
            step["wheel_version"],
            python,
            ";".join(step["targets"]),
            stage[step["name"]],
            needs[step["name"]],
            step["timeout_minutes"],
        )
        for step in document["steps"]
        for python in document["python"]
    ]
    stages = tuple(
        tuple(job for job in jobs if job.stage == number) for number in range(1, max(stage.values(), default=0) + 1)
    )
    return Matrix(
        document["line"], tuple(document["targets"]), document["driver"], stages, tuple(document.get("notes", ()))
    )


def matrix_document(matrix: Matrix) -> dict[str, Any]:
    """``--format json``."""
    return {
        "line": matrix.line,
        "targets": list(matrix.targets),
        "driver": matrix.driver,
        "notes": list(matrix.notes),
        "stages": [
            [
                {
                    "name": job.name,
                    "recipe": job.recipe,
                    "python": job.python,
                    "arch": job.arch,
                    "timeout_minutes": job.timeout_minutes,
                    "needs": list(job.needs),
                    "artifacts": list(job.artifacts),
                }
                for job in jobs
            ]
            for jobs in matrix.stages
        ],
    }


def github_outputs(matrix: Matrix) -> str:
    """``--format github``: ``key=value`` lines for ``$GITHUB_OUTPUT``, one matrix per stage job.

    A stage the plan does not use is empty, and the template skips its job.
    """
    if len(matrix.stages) > GITHUB_STAGES:
        raise RocwheelsError(
            f"line {matrix.line} needs {len(matrix.stages)} dependency stages; .github/workflows/wheels.yml declares {GITHUB_STAGES}",
            fix=f"add stage jobs to the workflow (copy the last one) and raise GITHUB_STAGES in {__name__}",
        )
    lines = [f"line={matrix.line}", f"stages={len(matrix.stages)}", "notes=" + "; ".join(matrix.notes)]
    for number in range(1, GITHUB_STAGES + 1):
        jobs = matrix.stages[number - 1] if number <= len(matrix.stages) else ()
        include = [
            {
                "recipe": j.recipe,
                "python": j.python,
                "arch": j.arch,
                "distribution": j.distribution,
                "wheel_version": j.wheel_version,
                "timeout_minutes": j.timeout_minutes,
            }
            for j in jobs
        ]
        lines.append(f"stage{number}=" + (json.dumps({"include": include}, separators=(",", ":")) if include else ""))
    return "\n".join(lines) + "\n"


def gitlab_pipeline(matrix: Matrix, *, arch: str, recipes: str | None) -> dict[str, Any]:
    """``--format gitlab``: the child pipeline the parent ``.gitlab-ci.yml`` triggers.

    JSON is YAML, so the document is written as JSON. Each job needs (with artifacts) the jobs of
    its Python's recipes it builds on; ``publish`` runs on tags and needs every build job. Every
    job names its image, runner tags and time limit.
    """
    stage_names = [f"stage{number}" for number in range(1, len(matrix.stages) + 1)]
    # What the parent's preflight job was given decides the children's builds too.
    settings = {"ARCH": arch, "ROCM": matrix.line, "DRIVER": matrix.driver}
    if recipes:
        settings["RECIPES"] = recipes
    pipeline: dict[str, Any] = {"stages": [*stage_names, "publish"], "variables": settings}
    names = {(job.recipe, job.python): job.name for job in matrix.jobs}
    for job in matrix.jobs:
        pipeline[job.name] = {
            "stage": f"stage{job.stage}",
            "image": JOB_IMAGE,
            "tags": list(BUILD_TAGS),
            "timeout": f"{job.timeout_minutes} minutes",
            "needs": [{"job": names[(need, job.python)], "artifacts": True} for need in job.needs],
            # The line and driver the matrix was made for, whatever the trigger forwards (the
            # parent's own variables outrank the child's). Exact builds come from the team's index
            # (ROCWHEELS_REUSE_INDEX, else the one publish uploads to), so a rerun of a commit
            # builds and publishes nothing new.
            "script": [
                f"make wheels RECIPES={job.recipe} PYTHON_VERSION={job.python} ARCH='{job.arch}'"
                f" ROCM={matrix.line} DRIVER={matrix.driver}"
                ' FROM_INDEX="${ROCWHEELS_REUSE_INDEX:-$ROCWHEELS_INDEX_URL}"'
            ],
            "artifacts": {"when": "always", "paths": list(job.artifacts)},
        }
    pipeline["publish"] = {
        "stage": "publish",
        "image": JOB_IMAGE,
        "tags": list(RUNNER_TAGS),
        "timeout": f"{PUBLISH_TIMEOUT_MINUTES} minutes",
        "rules": [{"if": "$CI_COMMIT_TAG"}],
        "needs": [{"job": job.name, "artifacts": True} for job in matrix.jobs],
        # ROCWHEELS_INDEX_URL, TWINE_USERNAME and TWINE_PASSWORD: masked CI/CD variables.
        "script": ['make publish REPOSITORY="$ROCWHEELS_INDEX_URL"'],
    }
    return pipeline


def render(matrix: Matrix, output_format: str, *, arch: str, recipes: str | None) -> str:
    if output_format == "github":
        return github_outputs(matrix)
    if output_format == "gitlab":
        return json.dumps(gitlab_pipeline(matrix, arch=arch, recipes=recipes), indent=2) + "\n"
    return json.dumps(matrix_document(matrix), indent=2) + "\n"


# --- wheels reused from the team's index ---


def _get(url: str, timeout: float, sink: BinaryIO | None = None) -> bytes | None:
    """The body at ``url`` (streamed into ``sink`` when given: wheels may be GBs, then b""); None when
    the index has nothing there (404). Each wait for the index is at most ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            if sink is None:
                body: bytes = response.read()
                return body
            shutil.copyfileobj(response, sink, 1 << 20)
            return b""
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise RocwheelsError(
            f"{url}: the index answered {exc.code} {exc.reason}", fix="check --from-index (a PEP 503 simple URL)"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            reason = f"no answer within {timeout:g} s (--timeout, {TIMEOUT_ENV})"
        raise RocwheelsError(
            f"{url}: index unreachable ({reason})",
            fix="check --from-index, or leave it out to build everything here",
        ) from None


def fetch_from_index(plan: Plan, layout: Layout, index_url: str, *, timeout: float = DEFAULT_TIMEOUT) -> dict[str, int]:
    """Put into the wheelhouse each wheel of the plan the index holds with the very same fingerprint.

    ``index_url`` is a PEP 503 simple root whose file links have the provenance record beside them
    (``<wheel URL>.provenance.json``), as the static index of ``rocwheels index build`` has, or
    the upload URL of such an index (``rocwheels serve``: ``http://host:8080/``), read at the
    simple page ``publish`` reads, so one URL serves the CI's reuse and its publish job. Anyone
    who can upload can write a record, so a wheel comes in only with a record signed by a key of
    the lock (``[signing] public_keys``) that names this build's fingerprint and the file's sha256,
    and only if the downloaded file then passes its RECORD check and verify (without the smoke
    test); the recipe's build then finds it up to date. Anything less is built here instead.
    Returns, per recipe, how many wheels came in.
    """
    root = simple_root(index_url)
    trusted = trusted_keys(layout.recipes_dir) or ()
    if not trusted:
        log.warning(
            "%s lists no signing keys ([signing] public_keys): no provenance record on %s can be believed, so "
            "every wheel is built here (docs/ci.md: Signed provenance)",
            layout.recipes_dir / LOCK_FILE,
            root,
        )
        return {step.name: 0 for step in plan.steps}
    prints = fingerprints(plan, layout.recipes_dir)
    pythons = {python_tag(version) for step in plan.steps for version in step.python}
    fetched: dict[str, int] = {}
    for step in plan.steps:
        logger = recipe_logger(step.name)
        fingerprint = prints[step.name][0]
        project_url = urllib.parse.urljoin(root, step.recipe.dist_name.replace("_", "-").lower() + "/")
        page = _get(project_url, timeout)
        count = 0
        for href in page_links((page or b"").decode("utf-8", "replace")):
            url = urllib.parse.urljoin(project_url, href).split("#", 1)[0]
            filename = urllib.parse.unquote(url.rsplit("/", 1)[-1])
            if not _wanted(filename, step.recipe.dist_name, step.wheel_version, pythons):
                continue
            target = layout.wheelhouse / filename
            if target.is_file() and is_current(target, fingerprint):
                continue
            if _fetch_one(url, target, Reuse(fingerprint, step.expect, trusted, timeout), logger):
                count += 1
        if count:
            logger.info("%d wheel(s) of this exact build taken from %s", count, root)
        fetched[step.name] = count
    return fetched


def simple_root(index_url: str) -> str:
    """``index_url`` when it is a simple index (its path has a ``simple`` or ``+simple`` part), else
    the simple index ``publish`` derives from an upload URL."""
    if {"simple", "+simple"} & set(urllib.parse.urlsplit(index_url).path.split("/")):
        return index_url.rstrip("/") + "/"
    return resolve_repository(index_url).simple_url


def _wanted(filename: str, dist_name: str, version: str, pythons: set[str]) -> bool:
    try:
        name, wheel_version, _, tags = parse_wheel_name(filename)  # variant wheels too
    except InvalidWheelFilename:
        return False
    return (
        name.replace("-", "_") == dist_name
        and str(wheel_version) == version
        and any(t.interpreter in pythons for t in tags)
    )


@dataclass(frozen=True)
class Reuse:
    """What a wheel on the index must prove to be taken instead of built."""

    fingerprint: str  # of this build's inputs
    expect: Expectations  # the recipe's verify rules, for the targets of this build
    trusted: tuple[str, ...]  # public keys that may sign records
    timeout: float


def _fetch_one(url: str, target: Path, reuse: Reuse, logger: RecipeLogger) -> bool:
    """Download a wheel and its record beside it, all or nothing, if the record is believed and names
    this build, and the wheel is the file it describes and passes verify."""
    record_bytes = _get(url + SUFFIX, reuse.timeout)
    if record_bytes is None:
        logger.info("%s: no provenance record on the index: not reused", target.name)
        return False
    try:
        record = Provenance.parse(record_bytes)
    except (ValueError, TypeError) as exc:
        logger.warning("%s: the record on the index is not a provenance record (%s): built here", target.name, exc)
        return False
    check = record.signature_check(reuse.trusted)
    if check.trust is not Trust.SIGNED:
        logger.warning("%s: the record on the index is %s: not believed, built here", target.name, check.message)
        return False
    if record.fingerprint != reuse.fingerprint or record.wheel != target.name:
        logger.info(
            "%s on the index was built from other inputs (fingerprint %s, this build %s): not reused",
            target.name,
            record.fingerprint[:12],
            reuse.fingerprint[:12],
        )
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        record_file = Path(tmp) / (target.name + SUFFIX)
        record_file.write_bytes(record_bytes)
        wheel_file = Path(tmp) / target.name
        with wheel_file.open("wb") as sink:
            _get(url, reuse.timeout, sink)  # a missing file stays empty: its sha256 cannot match
        actual = file_sha256(wheel_file)
        if actual != record.sha256:
            raise RocwheelsError(
                f"{url}: sha256 {actual} differs from its provenance record's {record.sha256}",
                fix="the file on the index changed after it was built and signed: rebuild and publish it again",
            )
        try:
            report = verify_wheel(wheel_file, reuse.expect, smoke=False, trusted_keys=reuse.trusted, sha256=actual)
            failures = "; ".join(f"{f.check}: {f.message}" for f in report.errors())
        except RocwheelsError as exc:  # a damaged archive or RECORD
            failures = exc.message
        if failures:
            logger.warning("%s on the index fails verify (%s): built here", target.name, failures)
            return False
        # The record first: alone it is harmless (no wheel, nothing up to date), and the wheel
        # then arrives with one rename.
        os.replace(record_file, record_path(target))
        os.replace(wheel_file, target)
    return True
