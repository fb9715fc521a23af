"""Wheel archives: safety checks, metadata, and atomic rewrites with a correct RECORD.

Every stage that opens a wheel checks it here first. auditwheel answers a damaged wheel with a
traceback (a RECORD naming files that are not there crashes it with FileNotFoundError) and pip
with an unhelpful one; a member path with ``..`` could write outside the folder it is unpacked to.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import zipfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath
from typing import TypeVar

from packaging.tags import Tag
from packaging.utils import (
    BuildTag,
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version
from variantlib.constants import VALIDATION_WHEEL_NAME_REGEX

from pipeline.errors import InputError, RocwheelsError
from pipeline.wheel.splice import BlockIndex
from pipeline.wheel.zipwrite import Added, check_members, record_lines, scan_members, write_wheel

# Signatures over RECORD: any rewrite invalidates them, so a rewrite drops them.
_RECORD_SIGNATURES = ("RECORD.jws", "RECORD.p7s")
_COPY_CHUNK = 1 << 20
_DRIVE = re.compile(r"^[A-Za-z]:")
_REBUILD = "rebuild the wheel; this file is damaged or was not written by a wheel build backend"
# RECORD hashes that still mean "these bytes" (the wheel spec asks for sha256 or stronger).
_STRONG_HASHES = frozenset({"sha256", "sha384", "sha512", "sha3_256", "sha3_384", "sha3_512", "blake2b"})
# Longest file name part and path Linux file systems write (NAME_MAX, PATH_MAX less room for the
# install prefix); a member past either cannot be installed.
_MAX_NAME_BYTES = 255
_MAX_PATH_BYTES = 3072
# Bounds on what a wheel may inflate to, checked before any member is read. The largest real
# wheels (torch with ROCm) inflate to a few GB, their members by less than 20 times; a deflate
# stream of zeros reaches ~1000 times. Members under the floor are not judged by ratio.
MAX_UNPACKED_VARIABLE = "ROCWHEELS_MAX_UNPACKED"
MAX_RATIO_VARIABLE = "ROCWHEELS_MAX_RATIO"
_DEFAULT_MAX_UNPACKED = 64 << 30
_DEFAULT_MAX_RATIO = 200
_RATIO_FLOOR = 1 << 20
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
T = TypeVar("T")


def split_variant(filename: str) -> tuple[str, str | None]:
    """(the file name without its PEP 825 variant label, the label or None): ``x-1.0-py3-none-any-gfx942.whl``
    -> (``x-1.0-py3-none-any.whl``, ``gfx942``)."""
    match = VALIDATION_WHEEL_NAME_REGEX.fullmatch(filename)
    if match is None or match["variant_label"] is None:
        return filename, None
    return match["base_wheel_name"] + ".whl", match["variant_label"]


def parse_wheel_name(filename: str) -> tuple[NormalizedName, Version, BuildTag, frozenset[Tag]]:
    """``packaging``'s ``parse_wheel_filename``, for plain and variant wheel names alike
    (packaging, pip and old installers reject the extra label part)."""
    return parse_wheel_filename(split_variant(filename)[0])


@dataclass(frozen=True)
class WheelInfo:
    path: Path
    name: str  # METADATA Name, as written
    version: str  # METADATA Version
    dist_info: str  # the folder inside the wheel: "rocm_canary-0.1.0.dist-info"
    tags: tuple[str, ...]  # WHEEL "Tag" lines: "cp311-cp311-linux_x86_64"
    root_is_purelib: bool

    @property
    def platform_tags(self) -> tuple[str, ...]:
        """The platform part of the file name, split on dots: ("manylinux_2_28_x86_64",)."""
        return tuple(split_variant(self.path.name)[0].removesuffix(".whl").rsplit("-", 1)[1].split("."))


@contextmanager
def open_wheel(path: Path) -> Iterator[zipfile.ZipFile]:
    """Open ``path`` as a zip archive; damage found on opening or reading becomes a RocwheelsError."""
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise RocwheelsError(
            f"{path}: no such wheel", fix="check the path; built wheels are in the wheelhouse"
        ) from None
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise RocwheelsError(f"{path}: not a readable zip archive ({exc})", fix=_REBUILD) from None
    with archive:
        try:
            yield archive
        # Corrupt member data only shows up when it is read (bad CRC, broken deflate stream).
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise RocwheelsError(f"{path}: damaged zip archive ({exc})", fix=_REBUILD) from None


def check_wheel(path: Path, *, verify_hashes: bool = True) -> WheelInfo:
    """Check that ``path`` is a wheel every later step can open safely, and describe it.

    Checks the file name, that every member path stays inside the wheel, one ``.dist-info``
    folder matching the name with WHEEL, METADATA and RECORD, and that RECORD and the archive
    list the same files. ``verify_hashes`` (the default: every stage checks them, so a member
    changed after the build is caught before repair writes a RECORD that hides the change) reads
    every member and compares its RECORD hash and size. Symbolic links are refused: pip would
    install them as regular files holding the link target's name.
    """
    checked = _check_structure(path)
    if verify_hashes:
        check_members(path, checked.hashed, record=checked.rows)
    return _describe(path, checked)


def read_wheel(
    path: Path, select: Callable[[bytes], bool], work: Callable[[str, Path], T]
) -> tuple[WheelInfo, dict[str, T]]:
    """:func:`check_wheel`, with the RECORD hashes checked in the one pass over the members that
    also hands each member whose first bytes ``select`` accepts to ``work(member, file)`` (a
    scratch copy, removed after): every member is inflated once. Member -> what ``work`` returned."""
    checked = _check_structure(path)
    with tempfile.TemporaryDirectory(prefix="rocwheels-read-") as scratch:
        read = scan_members(path, checked.hashed, record=checked.rows, select=select, work=work, scratch=Path(scratch))
    return _describe(path, checked), read


@dataclass(frozen=True)
class _Structure:
    """What check_wheel has read of a wheel before it reads the members' data."""

    dist_info: str
    hashed: list[zipfile.ZipInfo]  # the members RECORD hashes, in archive order
    rows: dict[str, tuple[str, str, str]]  # RECORD's rows by member: (name, hash, size)
    wheel: Message
    metadata: Message


def _check_structure(path: Path) -> _Structure:
    """check_wheel's checks of names, paths and RECORD's rows; the members' data is not read."""
    try:
        filename_name, filename_version, _, _ = parse_wheel_name(path.name)
    except InvalidWheelFilename as exc:
        raise RocwheelsError(
            f"{path}: not a wheel file name ({exc})", fix="keep the name the build backend gave it"
        ) from None
    with open_wheel(path) as archive:
        infos = archive.infolist()
        for info in infos:
            _check_member_path(path, info.filename, "member")
            if stat.S_ISLNK(info.external_attr >> 16):
                raise RocwheelsError(
                    f"{path}: member {info.filename} is a symbolic link; installers write it as a regular file",
                    fix="build the wheel without symlinks (copy the file, or set the library's RPATH instead)",
                )
        repeated = sorted(name for name, count in Counter(i.filename for i in infos).items() if count > 1)
        if repeated:
            raise RocwheelsError(f"{path}: members stored more than once: {_some(repeated)}", fix=_REBUILD)
        _check_inflated_size(path, infos)
        _check_installable_names(path, infos)
        files = {info.filename for info in infos if not info.is_dir()}

        dist_info = _dist_info_folder(path, files)
        stem = dist_info.removesuffix(".dist-info")
        info_name, _, info_version = stem.partition("-")
        if canonicalize_name(info_name) != filename_name or not _same_version(info_version, filename_version):
            raise RocwheelsError(
                f"{path}: its folder {dist_info} does not match the file name ({filename_name} {filename_version})",
                fix="rename the file after the project and version in METADATA, or rebuild the wheel",
            )
        for required in ("WHEEL", "METADATA", "RECORD"):
            if f"{dist_info}/{required}" not in files:
                raise RocwheelsError(f"{path}: {dist_info}/{required} is missing", fix=_REBUILD)

        record = _read_record(path, archive, f"{dist_info}/RECORD")
        unsigned = files - {f"{dist_info}/RECORD"} - {f"{dist_info}/{sig}" for sig in _RECORD_SIGNATURES}
        listed_missing = sorted(set(record) - files)
        if listed_missing:
            raise RocwheelsError(
                f"{path}: RECORD lists files the archive does not contain: {_some(listed_missing)}"
                + _dist_info_hint(listed_missing, dist_info),
                fix=_REBUILD,
            )
        unlisted = sorted(unsigned - set(record))
        if unlisted:
            raise RocwheelsError(f"{path}: files missing from RECORD: {_some(unlisted)}", fix=_REBUILD)
        hashed = _hashed_members(path, infos, record)

        wheel = _headers(archive, f"{dist_info}/WHEEL")
        metadata = _headers(archive, f"{dist_info}/METADATA")
    return _Structure(dist_info, hashed, {member: (member, *row) for member, row in record.items()}, wheel, metadata)


def _describe(path: Path, checked: _Structure) -> WheelInfo:
    """The wheel WHEEL and METADATA describe, once they agree with its file name."""
    filename_name, filename_version, _, _ = parse_wheel_name(path.name)
    wheel, metadata = checked.wheel, checked.metadata
    tags = tuple(wheel.get_all("Tag") or ())
    name, version = metadata.get("Name"), metadata.get("Version")
    if not tags or not name or not version:
        missing = [
            what
            for what, value in (("WHEEL Tag", tags), ("METADATA Name", name), ("METADATA Version", version))
            if not value
        ]
        raise RocwheelsError(f"{path}: {', '.join(missing)} missing", fix=_REBUILD)
    # pip installs what METADATA says: a file name that says otherwise misleads every check by name.
    if canonicalize_name(name) != filename_name or not _same_version(version, filename_version):
        raise RocwheelsError(
            f"{path}: METADATA says {name} {version}, the file name {filename_name} {filename_version}",
            fix="rename the file after the project and version in METADATA, or rebuild the wheel",
        )
    return WheelInfo(
        path=path,
        name=name,
        version=version,
        dist_info=checked.dist_info,
        tags=tags,
        root_is_purelib=(wheel.get("Root-Is-Purelib") or "").strip().lower() == "true",
    )


def extract(archive: zipfile.ZipFile, names: Iterable[str], dest: Path) -> dict[str, Path]:
    """Extract members ``names`` (from a checked wheel) under ``dest``, keeping permission bits."""
    extracted: dict[str, Path] = {}
    for name in names:
        info = archive.getinfo(name)
        _check_member_path(Path(archive.filename or "wheel"), name, "member")
        target = dest.joinpath(*PurePosixPath(name).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with archive.open(info) as source, target.open("wb") as sink:
            shutil.copyfileobj(source, sink, _COPY_CHUNK)
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            target.chmod(mode | 0o600)  # stay writable: the caller may patch it
        extracted[name] = target
    return extracted


def rewrite_wheel(
    source: Path,
    dest: Path,
    *,
    replace: Mapping[str, bytes | Path] | None = None,
    added: Mapping[str, Added] | None = None,
    dropped: frozenset[str] = frozenset(),
    compression_level: int = zlib.Z_DEFAULT_COMPRESSION,
    threads: int | None = None,
    force_zip64: bool = False,
    source_date_epoch: int | None = None,
    sync: bool = True,
    indexes: Mapping[str, BlockIndex] | None = None,
) -> Path:
    """Write ``source`` to ``dest`` with members in ``replace`` swapped, ``added`` ones appended,
    ``dropped`` ones (and RECORD signatures, which a rewrite invalidates) left out, and RECORD
    recomputed (see :func:`pipeline.wheel.zipwrite.write_wheel`).

    Members keep their order, time stamps and permissions (so SOURCE_DATE_EPOCH builds stay
    reproducible), or with ``source_date_epoch`` all get that time and fixed permissions;
    unchanged ones keep their compressed bytes, and changed ones that ``indexes`` describe keep
    the bits of their unchanged deflate blocks (see :mod:`pipeline.wheel.splice`). ``dest``
    appears atomically, and on disk unless not ``sync``.
    """
    if (
        not zlib.Z_NO_COMPRESSION <= compression_level <= zlib.Z_BEST_COMPRESSION
        and compression_level != zlib.Z_DEFAULT_COMPRESSION
    ):
        raise ValueError(f"deflate level {compression_level} is not -1 or 0..9")
    # Unchanged members keep their RECORD rows (a changed member stays visible to verify): no need
    # to read them all here.
    info = check_wheel(source, verify_hashes=False)
    return write_wheel(
        source,
        dest,
        record=f"{info.dist_info}/RECORD",
        changed=replace,
        added=added,
        dropped=dropped | {f"{info.dist_info}/{sig}" for sig in _RECORD_SIGNATURES},
        level=compression_level,
        threads=threads,
        force_zip64=force_zip64,
        source_date_epoch=source_date_epoch,
        sync=sync,
        indexes=indexes,
    )


def replace_platform_tag(filename: str, platform: str) -> str:
    """``foo-1.0-cp311-cp311-linux_x86_64.whl`` with its platform part set to ``platform``."""
    return f"{filename.removesuffix('.whl').rsplit('-', 1)[0]}-{platform}.whl"


def _check_member_path(wheel: Path, name: str, what: str) -> None:
    if not name:
        raise RocwheelsError(f"{wheel}: a {what} path is empty: no installer can write it", fix=_REBUILD)
    parts = name.split("/")
    if name.startswith("/") or _DRIVE.match(name) or "\\" in name or "\0" in name or ".." in parts:
        raise RocwheelsError(
            f"{wheel}: unsafe {what} path {name!r} (absolute, '..', or a backslash): it could be written outside the install folder",
            fix="do not install or publish this wheel; rebuild it from trusted sources",
        )


def _dist_info_folder(path: Path, files: set[str]) -> str:
    folders = sorted(
        {name.split("/", 1)[0] for name in files if "/" in name and name.split("/", 1)[0].endswith(".dist-info")}
    )
    if len(folders) != 1:
        found = f"found {', '.join(folders)}" if folders else "found none"
        raise RocwheelsError(f"{path}: a wheel has exactly one top-level .dist-info folder; {found}", fix=_REBUILD)
    return folders[0]


def _same_version(a: str, b: Version) -> bool:
    try:
        return Version(a) == b
    except InvalidVersion:
        return False


def _read_record(path: Path, archive: zipfile.ZipFile, name: str) -> dict[str, tuple[str, str]]:
    record: dict[str, tuple[str, str]] = {}
    for line, row in record_lines(archive, name):
        if len(row) != 3:
            raise RocwheelsError(f"{path}: {name} line {line} does not have 3 fields (path, hash, size)", fix=_REBUILD)
        _check_member_path(path, row[0], "RECORD")
        record[row[0]] = (row[1], row[2])
    return record


def _dist_info_hint(missing: list[str], dist_info: str) -> str:
    named = sorted({m.split("/", 1)[0] for m in missing if m.split("/", 1)[0].endswith(".dist-info")} - {dist_info})
    if not named:
        return ""
    return f" (RECORD names the folder {', '.join(named)}, but the wheel's is {dist_info})"


def _hashed_members(
    path: Path, members: list[zipfile.ZipInfo], record: dict[str, tuple[str, str]]
) -> list[zipfile.ZipInfo]:
    """The members whose RECORD hash is checked, in archive order; refuses a row without one, or
    with one weaker than sha256."""
    unhashed = {name for name in record if name.endswith("/RECORD") or name.rsplit("/", 1)[-1] in _RECORD_SIGNATURES}
    for name, (recorded, _) in record.items():
        if name in unhashed:
            continue
        if not recorded:  # a row without a hash would switch off the check of that very file
            raise RocwheelsError(f"{path}: RECORD has no hash for {name}", fix=_REBUILD)
        algorithm, _, _ = recorded.partition("=")
        if algorithm not in _STRONG_HASHES:
            raise RocwheelsError(
                f"{path}: RECORD hash for {name} uses {algorithm!r}, not sha256 or stronger", fix=_REBUILD
            )
    return [info for info in members if info.filename in record and info.filename not in unhashed]


def _check_installable_names(path: Path, infos: list[zipfile.ZipInfo]) -> None:
    """Refuse member names an installer cannot write as they are: a name longer than a file
    system allows, two names that differ only in case (one file on macOS and Windows), and a
    file that is also another member's folder."""
    files = [info.filename for info in infos if not info.is_dir()]
    for name in files:
        long = [part for part in name.split("/") if len(part.encode("utf-8")) > _MAX_NAME_BYTES]
        if long or len(name.encode("utf-8")) > _MAX_PATH_BYTES:
            raise RocwheelsError(
                f"{path}: member {name[:80]}… has a name longer than file systems allow "
                f"({_MAX_NAME_BYTES} bytes a part, {_MAX_PATH_BYTES} in all)",
                fix=_REBUILD,
            )
    folded: dict[str, str] = {}
    for name in sorted({*files, *(info.filename.rstrip("/") for info in infos if info.is_dir())}):
        other = folded.setdefault(name.casefold(), name)
        if other != name:
            raise RocwheelsError(
                f"{path}: members {other} and {name} differ only in case: on macOS and Windows one overwrites the other",
                fix=_REBUILD,
            )
    # Split as strings: PurePosixPath's parents take a third of a second on a torch-sized wheel.
    folders = {"/".join(parts[:depth]) for parts in (n.split("/") for n in files) for depth in range(1, len(parts))}
    clashes = sorted(set(files) & folders)
    if clashes:
        raise RocwheelsError(
            f"{path}: {_some(clashes)} is both a file and the folder of other members: no installer can write both",
            fix=_REBUILD,
        )


def _check_inflated_size(path: Path, infos: list[zipfile.ZipInfo]) -> None:
    """Refuse, before anything is inflated, an archive that would inflate past the bounds
    (``ROCWHEELS_MAX_UNPACKED``, ``ROCWHEELS_MAX_RATIO``): a zip bomb of 2 MB holding 2 GB would
    otherwise take that much memory in repair and disk in the smoke test. The sizes are those the
    archive declares; reading stops there (zipfile reads a member up to its declared size)."""
    limit, ratio = inflate_bounds()
    total = sum(info.file_size for info in infos)
    if total > limit:
        raise RocwheelsError(
            f"{path}: inflates to {total} bytes, more than the bound of {limit}",
            fix=f"rebuild the wheel, or if it is this big for a reason raise {MAX_UNPACKED_VARIABLE} (bytes, or with K/M/G/T)",
        )
    for info in infos:
        if info.file_size > _RATIO_FLOOR and info.file_size > ratio * max(info.compress_size, 1):
            raise RocwheelsError(
                f"{path}: member {info.filename} inflates {info.compress_size} bytes to {info.file_size} "
                f"(more than {ratio} times): refused as a zip bomb",
                fix=f"rebuild the wheel; if the member really compresses this well, raise {MAX_RATIO_VARIABLE}",
            )


def inflate_bounds() -> tuple[int, int]:
    """(largest total inflated size in bytes, largest compression ratio of one member)."""
    return (
        _bound(MAX_UNPACKED_VARIABLE, _DEFAULT_MAX_UNPACKED, with_unit=True),
        _bound(MAX_RATIO_VARIABLE, _DEFAULT_MAX_RATIO, with_unit=False),
    )


def _bound(variable: str, default: int, *, with_unit: bool) -> int:
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    number, unit = (text[:-1], text[-1].upper()) if with_unit and text[-1].upper() in _UNITS else (text, "")
    if not number.isdigit() or int(number) == 0:
        raise InputError(
            f"{variable}={text!r} is not a positive whole number{' (bytes, or with K/M/G/T)' if with_unit else ''}",
            fix=f"set {variable} to e.g. {'64G' if with_unit else default}, or unset it for the default",
        )
    return int(number) * _UNITS.get(unit, 1)


def _headers(archive: zipfile.ZipFile, name: str) -> Message:
    return HeaderParser().parsestr(archive.read(name).decode("utf-8", errors="replace"))


def _some(names: list[str], limit: int = 5) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
