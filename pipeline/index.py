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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from packaging.utils import InvalidWheelFilename, NormalizedName, parse_wheel_filename
from packaging.version import Version

from .errors import RocwheelsError
from .sources import file_sha256

log = logging.getLogger("rocwheels")

# `simple` is a symlink to the newest complete generation, swapped in one rename: a web server
# serving the wheelhouse sees the old index or the new one, never a half-written tree.
INDEX_LINK = "simple"
_GENERATION_PREFIX = ".simple-"


@dataclass(frozen=True)
class WheelFile:
    path: Path
    project: NormalizedName  # PEP 503 normalized: the name index pages are keyed by
    version: Version  # with its local label, e.g. 2.4.0+rocm6.2
    sha256: str

    @property
    def label(self) -> str | None:
        """The ROCm line this wheel belongs to (``rocm6.2``), or None for a wheel outside any line."""
        local = self.version.local
        return local if local and local.startswith("rocm") else None


def scan_wheels(wheelhouse: Path) -> tuple[WheelFile, ...]:
    """The wheels lying directly in ``wheelhouse`` (the verified ones), hashed, sorted by file name."""
    wheels = []
    for path in sorted(wheelhouse.glob("*.whl")):
        try:
            project, version, _build, _tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename as exc:
            raise RocwheelsError(
                f"{path}: not a valid wheel file name ({exc})",
                fix="remove or rename the file; only verified wheels belong in the wheelhouse") from None
        wheels.append(WheelFile(path, project, version, file_sha256(path)))
    return tuple(wheels)


def wheels_by_label(wheelhouse: Path, aliases: Mapping[str, str] | None = None) -> dict[str, tuple[WheelFile, ...]]:
    """The wheelhouse's wheels grouped by ROCm line label; wheels without one are left out (with a warning).

    ``aliases`` maps a package's own label to its line's (vLLM labels itself ``rocm624`` on the
    ``rocm6.2`` line), so a line's index and constraints hold all of its packages.
    """
    aliases = aliases or {}
    lines: dict[str, list[WheelFile]] = defaultdict(list)
    for wheel in scan_wheels(wheelhouse):
        if wheel.label is None:
            log.warning("%s: no +rocmX.Y local version label, left out of the per-line index and constraints",
                        wheel.path.name)
            continue
        lines[aliases.get(wheel.label, wheel.label)].append(wheel)
    if not lines:
        raise RocwheelsError(f"no wheels with a +rocmX.Y local version label in {wheelhouse}",
                             fix="build, repair and verify wheels first (they land in the wheelhouse)")
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
        raise RocwheelsError(f"{link} is a real folder; rocwheels keeps it as a link to the newest index",
                             fix=f"remove {link} (rocwheels rebuilds it) and run the index build again")
    generation = Path(tempfile.mkdtemp(prefix=_GENERATION_PREFIX, dir=wheelhouse))
    for label, wheels in lines.items():
        _write_line(generation / label, wheels)
    generation.chmod(0o755)  # mkdtemp makes it 0700; a web server running as another user must read it
    # Only a generation this function made is deleted, never whatever else a link might point at.
    previous = link.resolve() if link.is_symlink() else None
    pending_link = wheelhouse / f"{generation.name}.link"
    pending_link.symlink_to(generation.name)
    os.replace(pending_link, link)
    if previous and previous.parent == wheelhouse.resolve() and previous.name.startswith(_GENERATION_PREFIX):
        shutil.rmtree(previous, ignore_errors=True)
    for label, wheels in lines.items():
        log.info("index %s: %d projects, %d files -> %s/", label, len({w.project for w in wheels}), len(wheels),
                 link / label)
    return tuple(link / label for label in lines)


def _write_line(root: Path, wheels: tuple[WheelFile, ...]) -> None:
    projects = _by_project(wheels)
    anchors = [f'<a href="{quote(project)}/">{html.escape(project)}</a>' for project in sorted(projects)]
    _write_page(root / "index.html", "Simple index", anchors)
    for project, files in projects.items():
        # <label>/<project>/ sits three levels below the wheelhouse, where the wheels are.
        anchors = [f'<a href="../../../{quote(w.path.name)}#sha256={w.sha256}">{html.escape(w.path.name)}</a>'
                   for w in sorted(files, key=lambda w: w.path.name)]
        _write_page(root / project / "index.html", f"Links for {project}", anchors)


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


def write_constraints(wheelhouse: Path, lines: Lines | None = None, *, hashes: bool = True,
                      rocm_pins: Mapping[str, tuple[str, ...]] | None = None) -> tuple[Path, ...]:
    """Write ``wheelhouse/constraints-<label>.txt`` per ROCm line: ``name==version+rocmX.Y`` pins.

    With ``hashes`` every pin also lists the sha256 of each of its wheel files, so pip (26.x
    verified) takes only these exact files. Any hash switches pip into hash-checking mode for the
    whole install, though: a dependency fetched from elsewhere without a hash is then refused.
    ``hashes=False`` writes pins only, which still keep a higher version from another index out.
    ``rocm_pins`` (label -> pins) add a ``wheels`` line's ROCm packages, which come from AMD's index
    (or a mirror) and are pinned by version only.
    """
    written = []
    for label, wheels in (lines if lines is not None else wheels_by_label(wheelhouse)).items():
        pins = _by_project(wheels)
        text = [f"# {label} wheels built by rocwheels; use: pip install -c {_constraints_name(label)} ..."]
        for project, files in sorted(pins.items()):
            versions = sorted({str(w.version) for w in files})
            if len(versions) > 1:
                names = ", ".join(w.path.name for w in files)
                raise RocwheelsError(f"{project} has {len(versions)} versions in the {label} line ({names}); "
                                     "a constraints file can pin only one",
                                     fix="remove the wheels of the versions you do not want from the wheelhouse")
            pin = f"{project}=={versions[0]}"
            if hashes:
                pin += "".join(f" \\\n    --hash=sha256:{w.sha256}" for w in sorted(files, key=lambda w: w.path.name))
            text.append(pin)
        if rocm_pins and rocm_pins.get(label):
            text += ["# ROCm itself: the line's packages from AMD's index (--extra-index-url) or a mirror", *rocm_pins[label]]
        path = wheelhouse / _constraints_name(label)
        pending = path.with_name(f".{path.name}.tmp")
        pending.write_text("\n".join(text) + "\n", encoding="utf-8")
        os.replace(pending, path)
        log.info("constraints %s: %d pins -> %s", label, len(pins), path)
        written.append(path)
    return tuple(written)


def _constraints_name(label: str) -> str:
    return f"constraints-{label}.txt"
