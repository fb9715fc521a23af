"""What the wheelhouse offers installers: a static PEP 503 index and exact pins per ROCm line.

Wheels are grouped by their local version label (``+rocm6.2``): one ROCm line never mixes with
another, so each line gets its own index tree (``simple/rocm6.2/``) and its own constraints file.
"""

from __future__ import annotations

import html
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
    aliases = aliases or {}
    lines: dict[str, list[WheelFile]] = defaultdict(list)
    for wheel in wheels:
        if wheel.label is None:
            log.warning(
                "%s: no +rocmX.Y local version label, left out of the per-line index and constraints", wheel.path.name
            )
            continue
        lines[aliases.get(wheel.label, wheel.label)].append(wheel)
    if not lines:
        raise RocwheelsError(
            f"no wheels with a +rocmX.Y local version label in {wheelhouse}",
            fix="build, repair and verify wheels first (they land in the wheelhouse)",
        )
    return {label: tuple(wheels) for label, wheels in sorted(lines.items())}


# Grouped wheels of a wheelhouse (``wheels_by_label``): callers writing both the index and the
# constraints group once, so multi-GB wheels are hashed once.
Lines = Mapping[str, tuple[WheelFile, ...]]


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


def write_variants_json(wheels: Iterable[WheelFile]) -> tuple[Path, ...]:
    """Write ``{name}-{version}-variants.json`` beside the wheels of every release with variant wheels:
    all its variants' variant.json merged, so an installer learns every label from one file. Made
    again from the wheels each time: a variant added later is in it, one removed is not."""
    releases: dict[Path, list[Path]] = defaultdict(list)
    for wheel in wheels:
        if wheel.variant:
            releases[_release_file(wheel)].append(wheel.path)
    for path, variants in sorted(releases.items()):
        with atomic_write(path) as pending:
            pending.write(merge_variants_json(sorted(variants)).encode("utf-8"))
        log.info("%s: %d variant wheels -> %s", path.name, len(variants), path)
    return tuple(sorted(releases))


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
        # pip reads no variant file name: a line's pins name its plain wheels.
        pins = _by_project(tuple(w for w in wheels if w.variant is None))
        use = (
            f"pip install --require-hashes --no-deps -r {file_name(label)}"
            if hashes
            else f"pip install -c {file_name(label)} ..."
        )
        text = [f"# {label} wheels built by rocwheels; use: {use}"]
        for project, files in sorted(pins.items()):
            pin = f"{project}=={files[0].version}"
            if hashes:
                pin += "".join(f" \\\n    --hash=sha256:{w.sha256}" for w in sorted(files, key=lambda w: w.path.name))
            text.append(pin)
        if rocm_pins.get(label):
            text += [
                "# ROCm itself: the line's packages from AMD's index (--extra-index-url) or a mirror",
                *rocm_pins[label],
            ]
        path = wheelhouse / file_name(label)
        with atomic_write(path) as pending:
            pending.write(("\n".join(text) + "\n").encode("utf-8"))
        log.info("%s: %d pins -> %s", path.name, len(pins), path)
        written.append(path)
    return tuple(written)


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
class TeamIndex:
    written: tuple[tuple[str, Path], ...]  # (kind, path) of each index tree and pin file
    refused: tuple[Refused, ...]  # wheels of the wheelhouse that failed verify: not indexed, not pinned


def build_team_index(layout: Layout) -> TeamIndex:
    """``rocwheels index build``: the static index, constraints and hashed requirements of every line
    in the wheelhouse, written together, of the wheels that pass verify (``admit_wheels``)."""
    from pipeline.config import lock as lockmod
    from pipeline.config.recipes import LOCK_FILE
    from pipeline.config.rocm_wheels import constraint_pins
    from pipeline.description import label_aliases
    from pipeline.errors import InputError
    from pipeline.publish.admission import admit_wheels

    aliases = label_aliases(layout)
    if not layout.wheelhouse.is_dir():
        raise InputError(
            f"no wheelhouse at {layout.wheelhouse}",
            fix="build wheels first (rocwheels wheels ...) or pass --wheelhouse",
        )
    lock_lines = (
        lockmod.load_lock(layout.recipes_dir).lock.lines.values() if (layout.recipes_dir / LOCK_FILE).is_file() else ()
    )
    rocm_pins = {line.local_version: constraint_pins(line) for line in lock_lines if line.rocm_wheels}
    with wheelhouse_lock(layout.wheelhouse):
        admission = admit_wheels(layout.wheelhouse, layout).require_some()
        lines = group_by_label(admission.admitted, layout.wheelhouse, aliases)
        check_pinnable(lines)  # before the new index is swapped in: index and pin files change together
        written = [("index", root) for root in build_static_index(layout.wheelhouse, lines)]
        written += [("constraints", path) for path in write_constraints(layout.wheelhouse, lines, rocm_pins=rocm_pins)]
        written += [("requirements", path) for path in write_requirements(layout.wheelhouse, lines)]
    return TeamIndex(tuple(written), admission.refused)
