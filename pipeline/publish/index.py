"""What the wheelhouse offers installers: a static PEP 503 index and exact pins per ROCm line.

Wheels are grouped by their local version label (``+rocm6.2``): one ROCm line never mixes with
another, so each line gets its own index tree (``simple/rocm6.2/``) and its own constraints file.
"""

from __future__ import annotations

import html
import json
import logging
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from packaging.utils import InvalidWheelFilename, NormalizedName
from packaging.version import Version

from pipeline.config.layout import Layout
from pipeline.errors import RocwheelsError
from pipeline.util.files import atomic_write, file_sha256, raise_write_error
from pipeline.util.net import DEFAULT_TIMEOUT
from pipeline.util.runlock import GENERATION_PREFIX, INDEX_LINK, generation_prefix, wheelhouse_lock
from pipeline.verify.provenance import Provenance, record_path
from pipeline.wheel.archive import check_wheel, parse_wheel_name, split_variant
from pipeline.wheel.variant import merge_variants_json, variants_json_name

if TYPE_CHECKING:
    from pipeline.publish.admission import Refused

log = logging.getLogger("rocwheels")

# `simple` (INDEX_LINK) is a symlink to the newest complete generation, swapped in one rename: a
# web server serving the wheelhouse sees the old index or the new one, never a half-written tree.


@dataclass(frozen=True)
class WheelFile:
    path: Path
    project: NormalizedName  # PEP 503 normalized: the name index pages are keyed by
    version: Version  # with its local label, e.g. 2.4.0+rocm6.2
    sha256: str
    variant: str | None = None  # the PEP 825 variant label of a variant wheel (gfx942), None for a plain wheel

    @property
    def label(self) -> str | None:
        """The ROCm line this wheel belongs to (``rocm6.2``), or None for a wheel outside any line."""
        local = self.version.local
        return local if local and local.startswith("rocm") else None


def scan_wheels(wheelhouse: Path) -> tuple[WheelFile, ...]:
    """The wheels lying directly in ``wheelhouse``, hashed, sorted by file name (``wheel_file`` each)."""
    return tuple(wheel_file(path) for path in sorted(wheelhouse.glob("*.whl")))


def wheel_file(path: Path) -> WheelFile:
    """One wheel of the wheelhouse, hashed.

    It must be a well-formed wheel (a text file named ``*.whl`` is not offered to installers),
    and one with a provenance record must still be the file verify accepted: what is indexed,
    pinned or uploaded is exactly the verified bytes.
    """
    try:
        project, version, _build, _tags = parse_wheel_name(path.name)
    except InvalidWheelFilename as exc:
        raise RocwheelsError(
            f"{path}: not a valid wheel file name ({exc})",
            fix="remove or rename the file; only verified wheels belong in the wheelhouse",
        ) from None
    # Member hashes were checked by verify; the sha256 against the record below covers every byte since.
    check_wheel(path, verify_hashes=False)
    wheel = WheelFile(path, project, version, file_sha256(path), split_variant(path.name)[1])
    _check_provenance(wheel)
    return wheel


def _check_provenance(wheel: WheelFile) -> None:
    record = record_path(wheel.path)
    if record.is_file() and Provenance.read(record).sha256 != wheel.sha256:
        raise RocwheelsError(
            f"{wheel.path}: its sha256 {wheel.sha256} is not the one verify accepted ({record.name}): "
            "the file changed after it was verified",
            fix=f"remove {wheel.path.name} and {record.name} and build it again (rocwheels wheels ... --force)",
        )


# Grouped wheels of a wheelhouse (``wheels_by_label``): callers writing both the index and the
# constraints group once, so multi-GB wheels are hashed once.
Lines = Mapping[str, tuple[WheelFile, ...]]


def wheels_by_label(wheelhouse: Path, aliases: Mapping[str, str] | None = None) -> dict[str, tuple[WheelFile, ...]]:
    """The wheelhouse's wheels grouped by ROCm line label; wheels without one are left out (with a warning).

    ``aliases`` maps a package's own label to its line's (vLLM labels itself ``rocm624`` on the
    ``rocm6.2`` line), so a line's index and constraints hold all of its packages.
    """
    return group_by_label(scan_wheels(wheelhouse), wheelhouse, aliases)


def group_by_label(
    wheels: Iterable[WheelFile], wheelhouse: Path, aliases: Mapping[str, str] | None = None
) -> dict[str, tuple[WheelFile, ...]]:
    """``wheels`` (of ``wheelhouse``) grouped by ROCm line label, as ``wheels_by_label`` describes."""
    wheels = tuple(wheels)
    for wheel in wheels:
        if wheel.label is None:
            log.warning(
                "%s: no +rocmX.Y local version label, left out of the per-line index and constraints", wheel.path.name
            )
    lines = label_lines(wheels, aliases)
    if not lines:
        raise RocwheelsError(
            f"no wheels with a +rocmX.Y local version label in {wheelhouse}",
            fix="build, repair and verify wheels first (they land in the wheelhouse)",
        )
    return lines


def label_lines(
    wheels: Iterable[WheelFile], aliases: Mapping[str, str] | None = None
) -> dict[str, tuple[WheelFile, ...]]:
    """Any wheels (a wheelhouse's, an index's) by ROCm line label, sorted; wheels without one are left out."""
    aliases = aliases or {}
    lines: dict[str, list[WheelFile]] = defaultdict(list)
    for wheel in wheels:
        if wheel.label is not None:
            lines[aliases.get(wheel.label, wheel.label)].append(wheel)
    return {label: tuple(wheels) for label, wheels in sorted(lines.items())}


def newest_releases(lines: Lines) -> dict[str, tuple[WheelFile, ...]]:
    """Each project's newest release per line, its plain wheel and variants: what an index that keeps
    every version it was given (a team's) pins. The newest version with a plain wheel wins, as pins
    name plain wheels only."""
    newest = {}
    for label, wheels in lines.items():
        kept = []
        for files in _by_project(wheels).values():
            plain = [w.version for w in files if w.variant is None]
            version = max(plain or [w.version for w in files])
            kept += [w for w in files if w.version == version]
        newest[label] = tuple(sorted(kept, key=lambda w: w.path.name))
    return newest


def build_static_index(wheelhouse: Path, lines: Lines | None = None) -> tuple[Path, ...]:
    """Write ``wheelhouse/simple/<label>/`` PEP 503 trees, one per ROCm line, and return their folders.

    File links point back at the wheels (``../../../<file>#sha256=...``), so serving the wheelhouse
    folder with any static web server (``python -m http.server -d wheelhouse``) serves the index.
    PEP 691 JSON is not written: pip only asks for it through content negotiation, which a static
    server does not do.
    """
    lines = lines if lines is not None else wheels_by_label(wheelhouse)
    link = wheelhouse / INDEX_LINK
    if link.exists() and not link.is_symlink():
        raise RocwheelsError(
            f"{link} is a real folder; rocwheels keeps it as a link to the newest index",
            fix=f"remove {link} (rocwheels rebuilds it) and run the index build again",
        )
    # The pages link each release's variants.json: it is written first, from the wheels listed.
    write_variants_json(w for wheels in lines.values() for w in wheels)
    try:
        generation = Path(tempfile.mkdtemp(prefix=generation_prefix(), dir=wheelhouse))
    except OSError as exc:
        raise_write_error(exc, wheelhouse / INDEX_LINK)
    pending_link = wheelhouse / f"{generation.name}.link"
    try:
        for label, wheels in lines.items():
            _write_line(generation / label, wheels)
        generation.chmod(0o755)  # mkdtemp makes it 0700; a web server running as another user must read it
        # Only a generation this function made is deleted, never whatever else a link might point at.
        previous = link.resolve() if link.is_symlink() else None
        pending_link.symlink_to(generation.name)
        os.replace(pending_link, link)
    except BaseException as exc:
        pending_link.unlink(missing_ok=True)
        shutil.rmtree(generation, ignore_errors=True)
        if isinstance(exc, OSError):
            raise_write_error(exc, generation)
        raise
    if previous and previous.parent == wheelhouse.resolve() and previous.name.startswith(GENERATION_PREFIX):
        shutil.rmtree(previous, ignore_errors=True)
    for label, wheels in lines.items():
        log.info(
            "index %s: %d projects, %d files -> %s/", label, len({w.project for w in wheels}), len(wheels), link / label
        )
    return tuple(link / label for label in lines)


def _write_line(root: Path, wheels: tuple[WheelFile, ...]) -> None:
    projects = _by_project(wheels)
    anchors = [f'<a href="{quote(project)}/">{html.escape(project)}</a>' for project in sorted(projects)]
    _write_page(root / "index.html", "Simple index", anchors)
    for project, files in projects.items():
        # <label>/<project>/ sits three levels below the wheelhouse, where the wheels and variants.json are.
        anchors = [
            f'<a href="../../../{quote(path.name)}#sha256={sha256}">{html.escape(path.name)}</a>'
            for path, sha256 in sorted(_listed_files(files))
        ]
        _write_page(root / project / "index.html", f"Links for {project}", anchors)


def _listed_files(wheels: list[WheelFile]) -> list[tuple[Path, str]]:
    """What a project page lists: its wheels and, for a release with variant wheels, its
    ``{name}-{version}-variants.json`` (written by :func:`write_variants_json`)."""
    releases = {_release_file(w) for w in wheels if w.variant}
    return [(w.path, w.sha256) for w in wheels] + [(path, file_sha256(path)) for path in releases]


def _release_file(wheel: WheelFile) -> Path:
    return wheel.path.with_name(variants_json_name(wheel.path.name.split("-", 1)[0], str(wheel.version)))


def variant_releases(wheels: Iterable[WheelFile]) -> dict[Path, tuple[Path, ...]]:
    """Each release with variant wheels: its ``{name}-{version}-variants.json`` beside the wheels ->
    its variant wheels, sorted."""
    releases: dict[Path, list[Path]] = defaultdict(list)
    for wheel in wheels:
        if wheel.variant:
            releases[_release_file(wheel)].append(wheel.path)
    return {path: tuple(sorted(variants)) for path, variants in sorted(releases.items())}


def write_variants_json(wheels: Iterable[WheelFile]) -> tuple[Path, ...]:
    """Write ``{name}-{version}-variants.json`` beside the wheels of every release with variant wheels:
    all its variants' variant.json merged, so an installer learns every label from one file. Made
    again from the wheels each time: a variant added later is in it, one removed is not."""
    releases = variant_releases(wheels)
    for path, variants in releases.items():
        with atomic_write(path) as pending:
            pending.write(merge_variants_json(variants).encode("utf-8"))
        log.info("%s: %d variant wheels -> %s", path.name, len(variants), path)
    return tuple(releases)


def _by_project(wheels: tuple[WheelFile, ...]) -> dict[str, list[WheelFile]]:
    projects: dict[str, list[WheelFile]] = defaultdict(list)
    for wheel in wheels:
        projects[wheel.project].append(wheel)
    return projects


def _write_page(path: Path, title: str, anchors: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "<br>\n".join(anchors)
    path.write_text(
        "<!DOCTYPE html>\n<html>\n<head>\n"
        '<meta name="pypi:repository-version" content="1.0">\n'
        f"<title>{html.escape(title)}</title>\n</head>\n<body>\n<h1>{html.escape(title)}</h1>\n"
        f"{body}\n</body>\n</html>\n",
        encoding="utf-8",
    )


def write_constraints(
    wheelhouse: Path, lines: Lines | None = None, *, rocm_pins: Mapping[str, tuple[str, ...]] | None = None
) -> tuple[Path, ...]:
    """Write ``wheelhouse/constraints-<label>.txt`` per ROCm line: ``name==version+rocmX.Y`` pins.

    Pins only, no hashes: every pip takes them (pip before 26.1 refuses a constraints file with
    hashes), and exact pins keep a higher version or a non-ROCm build from another index out.
    ``rocm_pins`` (label -> pins) add a ``wheels`` line's ROCm packages, which come from AMD's index
    (or a mirror) and are pinned by version only.
    """
    return _write_pin_files(wheelhouse, lines, _constraints_name, hashes=False, rocm_pins=rocm_pins or {})


def write_requirements(wheelhouse: Path, lines: Lines | None = None) -> tuple[Path, ...]:
    """Write ``wheelhouse/requirements-<label>.txt`` per ROCm line: the same pins, each with the
    sha256 of every one of its wheel files, for ``pip install --require-hashes -r`` (any pip):
    only these exact files install, not another file published elsewhere under the same version.
    """
    return _write_pin_files(wheelhouse, lines, _requirements_name, hashes=True, rocm_pins={})


def pin_files(lines: Lines, *, rocm_pins: Mapping[str, tuple[str, ...]] | None = None) -> dict[str, str]:
    """File name -> text of every line's constraints and requirements file, as :func:`write_constraints`
    and :func:`write_requirements` write them (``rocwheels serve`` hands out the same texts)."""
    check_pinnable(lines)
    files = {}
    for label, wheels in lines.items():
        files[_constraints_name(label)] = _pin_text(label, wheels, hashes=False, rocm_pins=(rocm_pins or {}).get(label))
        files[_requirements_name(label)] = _pin_text(label, wheels, hashes=True, rocm_pins=None)
    return files


def _write_pin_files(
    wheelhouse: Path,
    lines: Lines | None,
    file_name: Callable[[str], str],
    *,
    hashes: bool,
    rocm_pins: Mapping[str, tuple[str, ...]],
) -> tuple[Path, ...]:
    written = []
    lines = lines if lines is not None else wheels_by_label(wheelhouse)
    check_pinnable(lines)
    for label, wheels in lines.items():
        path = wheelhouse / file_name(label)
        with atomic_write(path) as pending:
            pending.write(_pin_text(label, wheels, hashes=hashes, rocm_pins=rocm_pins.get(label)).encode("utf-8"))
        log.info("%s: pins of the %s line -> %s", path.name, label, path)
        written.append(path)
    return tuple(written)


def _pin_text(label: str, wheels: tuple[WheelFile, ...], *, hashes: bool, rocm_pins: tuple[str, ...] | None) -> str:
    # pip reads no variant file name: a line's pins name its plain wheels.
    pins = _by_project(tuple(w for w in wheels if w.variant is None))
    use = (
        f"pip install --require-hashes --no-deps -r {_requirements_name(label)}"
        if hashes
        else f"pip install -c {_constraints_name(label)} ..."
    )
    text = [f"# {label} wheels built by rocwheels; use: {use}"]
    for project, files in sorted(pins.items()):
        pin = f"{project}=={files[0].version}"
        if hashes:
            pin += "".join(f" \\\n    --hash=sha256:{w.sha256}" for w in sorted(files, key=lambda w: w.path.name))
        text.append(pin)
    if rocm_pins:
        text += ["# ROCm itself: the line's packages from AMD's index (--extra-index-url) or a mirror", *rocm_pins]
    return "\n".join(text) + "\n"


def check_pinnable(lines: Lines) -> None:
    """Each project has one version per line (a constraints file pins one): checked before anything is written."""
    for label, wheels in lines.items():
        for project, files in sorted(_by_project(wheels).items()):
            versions = sorted({str(w.version) for w in files})
            if len(versions) > 1:
                names = ", ".join(w.path.name for w in files)
                raise RocwheelsError(
                    f"{project} has {len(versions)} versions in the {label} line ({names}); "
                    "a constraints file can pin only one",
                    fix="remove the wheels of the versions you do not want from the wheelhouse",
                )


def _constraints_name(label: str) -> str:
    return f"constraints-{label}.txt"


def _requirements_name(label: str) -> str:
    return f"requirements-{label}.txt"


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def page_links(page: str) -> list[str]:
    """The ``<a href>`` targets of a PEP 503 project page, in order."""
    anchors = _Anchors()
    anchors.feed(page)
    return anchors.hrefs


@dataclass(frozen=True)
class LineSettings:
    """What the lock adds to a line's pins: labels packages give themselves (``rocm624`` -> ``rocm6.2``)
    and a ``wheels`` line's ROCm packages (label -> pins)."""

    aliases: Mapping[str, str]
    rocm_pins: Mapping[str, tuple[str, ...]]

    def to_json(self) -> str:
        return json.dumps({"aliases": dict(self.aliases), "rocm_pins": dict(self.rocm_pins)})

    @classmethod
    def from_json(cls, text: str) -> LineSettings:
        data = json.loads(text)
        return cls(data["aliases"], {label: tuple(pins) for label, pins in data["rocm_pins"].items()})


def line_settings(layout: Layout) -> LineSettings:
    """The lines' settings from the recipes folder; none without a lock (a packages folder served alone)."""
    from pipeline.config import lock as lockmod
    from pipeline.config.recipes import LOCK_FILE
    from pipeline.config.rocm_wheels import constraint_pins
    from pipeline.description import label_aliases

    if not (layout.recipes_dir / LOCK_FILE).is_file():
        return LineSettings({}, {})
    lock_lines = lockmod.load_lock(layout.recipes_dir).lock.lines.values()
    rocm_pins = {line.local_version: constraint_pins(line) for line in lock_lines if line.rocm_wheels}
    return LineSettings(label_aliases(layout), rocm_pins)


def index_lines(
    index_url: str, local: Lines, aliases: Mapping[str, str], timeout: float
) -> dict[str, tuple[WheelFile, ...]]:
    """What the team index at ``index_url`` (a PEP 503 root) holds, per line: each project's newest
    release with the sha256 the index lists. Every way the local wheelhouse's lines disagree with
    it is logged as a warning naming the file: the pins follow the index, which is what teammates
    install from."""
    from pipeline.publish.upload import listed_wheels

    held = []
    for name, sha256 in sorted(listed_wheels(index_url, timeout).items()):
        try:
            project, version, _build, _tags = parse_wheel_name(name)
        except InvalidWheelFilename:
            continue  # not a wheel rocwheels wrote, so no pin of ours
        # An index's wheel is known by its name and listed hash: the path is the file name alone.
        held.append(WheelFile(Path(name), project, version, sha256, split_variant(name)[1]))
    lines = newest_releases(label_lines(held, aliases))
    if not lines:
        raise RocwheelsError(
            f"{index_url} lists no wheels with a +rocmX.Y local version label",
            fix="publish the wheelhouse first (rocwheels publish --repository ...), or check --index-url "
            "(a PEP 503 simple root such as http://host:8080/simple/)",
        )
    on_index = {w.path.name: w for w in held}
    local_files = {w.path.name: w for wheels in local.values() for w in wheels}
    for name, wheel in sorted(local_files.items()):
        there = on_index.get(name)
        if there is None:
            log.warning(
                "%s is in the wheelhouse but not on %s (not published?): the pin files leave it out", name, index_url
            )
        elif there.sha256 != wheel.sha256:
            log.warning(
                "%s: %s holds sha256 %s, the wheelhouse %s: the pin files hold the index's",
                name,
                index_url,
                there.sha256,
                wheel.sha256,
            )
    for wheels in lines.values():
        for wheel in wheels:
            if wheel.path.name not in local_files:
                log.warning(
                    "%s is on %s but not in the wheelhouse: pinned as the index holds it", wheel.path.name, index_url
                )
    return lines


@dataclass(frozen=True)
class TeamIndex:
    written: tuple[tuple[str, Path], ...]  # (kind, path) of each index tree and pin file
    refused: tuple[Refused, ...]  # wheels of the wheelhouse that failed verify: not indexed, not pinned


def build_team_index(layout: Layout, index_url: str | None = None, *, timeout: float = DEFAULT_TIMEOUT) -> TeamIndex:
    """``rocwheels index build``: the static index, constraints and hashed requirements of every line
    in the wheelhouse, written together, of the wheels that pass verify (``admit_wheels``). Given the
    team index's ``index_url``, the pin files hold what that index holds, and each difference from
    the wheelhouse is warned about."""
    from pipeline.errors import InputError
    from pipeline.publish.admission import admit_wheels

    if not layout.wheelhouse.is_dir():
        raise InputError(
            f"no wheelhouse at {layout.wheelhouse}",
            fix="build wheels first (rocwheels wheels ...) or pass --wheelhouse",
        )
    settings = line_settings(layout)
    with wheelhouse_lock(layout.wheelhouse):
        admission = admit_wheels(layout.wheelhouse, layout).require_some()
        lines = group_by_label(admission.admitted, layout.wheelhouse, settings.aliases)
        check_pinnable(lines)  # before the new index is swapped in: index and pin files change together
        pinned = index_lines(index_url, lines, settings.aliases, timeout) if index_url else lines
        written = [("index", root) for root in build_static_index(layout.wheelhouse, lines)]
        written += [
            ("constraints", path) for path in write_constraints(layout.wheelhouse, pinned, rocm_pins=settings.rocm_pins)
        ]
        written += [("requirements", path) for path in write_requirements(layout.wheelhouse, pinned)]
    return TeamIndex(tuple(written), admission.refused)
