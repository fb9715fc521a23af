"""Wheels and archives written byte for byte by the tests: pure-Python and platform wheels with a
correct RECORD, and raw ZIP files for wheels that are broken on purpose."""

from __future__ import annotations

import base64
import hashlib
import platform
import stat
import sys
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

# One fixed timestamp for every archive member: the same content always gives the same sha256.
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)


def wheel_archive(
    path: Path,
    name: str,
    version: str,
    tag: str,
    purelib: bool,
    contents: dict[str, bytes],
    requires: tuple[str, ...] = (),
    provides_extras: tuple[str, ...] = (),
) -> Path:
    """Write ``contents`` plus METADATA, WHEEL and a correct RECORD as the wheel ``path``."""
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    contents = dict(contents)
    contents[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Provides-Extra: {e}\n" for e in provides_extras)
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    ).encode()
    contents[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: rocwheels-tests\nRoot-Is-Purelib: {str(purelib).lower()}\nTag: {tag}\n"
    ).encode()
    record = [
        f"{member},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for member, data in contents.items()
    ]
    contents[f"{dist_info}/RECORD"] = ("\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, data in contents.items():
            info = zipfile.ZipInfo(member, _ZIP_DATE)
            # S_IFREG too: pip marks a file executable only when the mode says it is a regular file.
            info.external_attr = (stat.S_IFREG | (0o755 if data.startswith((b"\x7fELF", b"#!")) else 0o644)) << 16
            archive.writestr(info, data)
    return path


def write_wheel(directory: Path, name: str, version: str, build: str = "ours", requires: tuple[str, ...] = ()) -> Path:
    """A small valid pure-Python wheel; ``build`` becomes ``<module>.BUILD``, so two files of one
    name and version differ and an install shows which one pip took."""
    module = name.replace("-", "_")
    return wheel_archive(
        directory / f"{module}-{version}-py3-none-any.whl",
        name,
        version,
        "py3-none-any",
        True,
        {f"{module}/__init__.py": f"BUILD = {build!r}\n".encode()},
        requires,
    )


def write_platform_wheel(
    directory: Path,
    name: str,
    files: Mapping[str, bytes | Path],
    *,
    version: str = "1.0",
    platform_tag: str | None = None,
) -> Path:
    """A ``cpXY-cpXY-linux_<machine>`` wheel (platlib) of ``files`` (member -> content or file to copy)."""
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    plat = platform_tag or f"linux_{platform.machine()}"
    contents = {member: data if isinstance(data, bytes) else data.read_bytes() for member, data in files.items()}
    return wheel_archive(
        directory / f"{name}-{version}-{python}-{python}-{plat}.whl",
        name,
        version,
        f"{python}-{python}-{plat}",
        False,
        contents,
    )


def write_raw_zip(path: Path, members: Mapping[str, bytes]) -> Path:
    """An archive exactly as given (no RECORD or metadata added), for wheels that are broken on purpose."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def the_build(wheels: Iterable[Path]) -> Path:
    """The one build among ``wheels``: its plain wheel when the line publishes one (every target of
    the line), else its variant wheel; fails when the files are of more than one build."""
    from pipeline.wheel.archive import split_variant

    files = sorted(wheels)
    builds = {split_variant(path.name)[0] for path in files}
    assert len(builds) == 1, f"expected the files of one build, got {[p.name for p in files]}"
    plain = [path for path in files if split_variant(path.name)[1] is None]
    variants = [path for path in files if split_variant(path.name)[1] is not None]
    assert len(plain) <= 1 and len(variants) <= 1, [p.name for p in files]
    return (plain or variants)[0]
