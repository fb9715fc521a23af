"""How many compile jobs a build runs: the memory one unit was measured to need, and what the host has.

A build of CK kernels or of torch runs out of memory long before it runs out of cores (upstream
flash-attention advises capping ``MAX_JOBS`` below 96 GB of RAM). The preflight measures the peak
memory of a sample of a recipe's own translation units; this module keeps that measurement in the
wheelhouse as the line's **build profile** (``build-profile-<line>.json``) and turns it, with the
memory and cores the build host (or container) has, into the ``{jobs}`` recipes give ``MAX_JOBS``.

``MAX_JOBS`` is what sets ninja's ``-j``: torch.utils.cpp_extension (``_get_num_workers``, used
by flash-attention's ``NinjaBuildExtension``, which keeps a ``MAX_JOBS`` already set) runs
``ninja -v -j MAX_JOBS``, and PyTorch's own ``tools/setup_helpers/cmake.py`` passes ``-j MAX_JOBS``
to ``cmake --build``; the recipes set ``MAX_JOBS = "{jobs}"``.

Runs inside the builder image too (through the rocwheels installed there): plain Python, reading
``/proc`` and the cgroup files of the process itself.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from pipeline.errors import ConfigError, InputError
from pipeline.util.files import atomic_write

# Without a build profile: upstream figures agree on about 8 GB per compile job for torch and
# flash-attention's CK kernels (docs/build-host.md, "What make wheels ARCH=gfx942 builds").
ASSUMED_PEAK_BYTES = 8 << 30
# The share of the available memory a build leaves free: the linker, Python, ninja and page cache
# also need some, and units of one recipe differ (the preflight samples the cheapest ones).
HEADROOM = 0.2
PROFILE_SCHEMA = 1
# Where the engine's memory limit for builder containers is set (podman/docker `--memory` syntax).
CONTAINER_MEMORY = "ROCWHEELS_CONTAINER_MEMORY"
# cgroup v1 writes "no limit" as the largest page-aligned counter (9223372036854771712); v2 as "max".
_UNLIMITED = 1 << 60
_SIZE = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[bkmgt]?)i?b?\s*$", re.I)


def gib(size: int) -> str:
    return f"{size / (1 << 30):.1f} GiB"


@dataclass(frozen=True)
class HostCapacity:
    """Memory and cores a build can use where it runs: this host, or the container it runs in."""

    memory_bytes: int  # MemAvailable, or less where the process's cgroup allows less
    cores: int  # CPUs the process may run on, or fewer where a cgroup CPU quota allows fewer
    where: str = "on this host"  # for notes: "on this host", "in the builder container (--memory 8g)"

    @classmethod
    def measure(cls, root: Path = Path("/"), *, affinity: int | None = None) -> HostCapacity:
        """Read ``root``'s ``/proc`` and the cgroup files of this process (``root`` other than / in tests).

        ``affinity``: the CPUs this process may use; None reads them (``sched_getaffinity``).
        """
        cores = affinity if affinity is not None else len(os.sched_getaffinity(0))
        memory = _meminfo_available(root)
        for folder in _cgroup_folders(root):
            memory = min(memory, _cgroup_memory_left(folder))
            quota = _cgroup_cpu_quota(folder)
            if quota is not None:
                cores = min(cores, max(1, math.ceil(quota)))
        return cls(memory_bytes=max(0, memory), cores=max(1, cores))

    def limited(self, memory_bytes: int, where: str) -> HostCapacity:
        """This capacity within a container given at most ``memory_bytes``."""
        return replace(self, memory_bytes=min(self.memory_bytes, memory_bytes), where=where)


@dataclass(frozen=True)
class JobsDecision:
    jobs: int
    note: str = ""  # set where memory, not cores, decides, or one unit needs more than there is


def jobs_for(
    peak_rss_bytes_per_unit: int, capacity: HostCapacity, *, headroom: float = HEADROOM, measured: str = ""
) -> JobsDecision:
    """As many jobs as cores, but no more than the available memory (less ``headroom``) carries.

    ``measured`` says where the peak comes from, for the note ("flash-attention preflight").
    """
    if peak_rss_bytes_per_unit <= 0:
        raise ValueError(f"peak memory per unit must be positive, not {peak_rss_bytes_per_unit}")
    usable = int(capacity.memory_bytes * (1 - headroom))
    fit = usable // peak_rss_bytes_per_unit
    per_unit = f"{gib(peak_rss_bytes_per_unit)} per unit {measured or 'assumed'}"
    available = f"{gib(capacity.memory_bytes)} available {capacity.where}"
    if fit < 1:
        return JobsDecision(
            1,
            f"1 job, and even that may run out of memory: {available}, {per_unit}; "
            f"give the build more memory (or a larger {CONTAINER_MEMORY}) or close other programs",
        )
    if fit < capacity.cores:
        return JobsDecision(fit, f"{fit} job{'s' if fit > 1 else ''}, not {capacity.cores}: {available}, {per_unit}")
    return JobsDecision(capacity.cores)


def decide_jobs(recipe: str, asked: int | None, profile: BuildProfile | None, capacity: HostCapacity) -> JobsDecision:
    """A build's jobs: those asked for (``--jobs``), else what the line's build profile measured for
    ``recipe`` allows on ``capacity``, else what the memory allows at the assumed 8 GB per job."""
    if asked:
        return JobsDecision(asked)
    measured = profile.recipes.get(recipe) if profile else None
    if measured:
        return measured.jobs(recipe, capacity)
    return jobs_for(
        ASSUMED_PEAK_BYTES,
        capacity,
        headroom=0,
        measured="assumed (no build profile for this line: `rocwheels wheels --preflight` measures one)",
    )


def container_capacity(host: HostCapacity, environ: Mapping[str, str] = os.environ) -> HostCapacity:
    """What a builder container started on ``host`` gets: ``ROCWHEELS_CONTAINER_MEMORY``, if set, bounds its memory."""
    value = environ.get(CONTAINER_MEMORY, "").strip()
    if not value:
        return replace(host, where="in the builder container (no memory limit set)")
    return host.limited(parse_size(value, CONTAINER_MEMORY), f"in the builder container (--memory {value})")


def parse_size(value: str, where: str) -> int:
    """``700m``, ``8g``, ``8GiB``, ``1024`` (bytes) as podman and docker read ``--memory``: binary units."""
    match = _SIZE.match(value)
    if not match:
        raise InputError(
            f"{where}={value!r} is not a memory size", fix="write it as podman's --memory takes it: 8g, 700m"
        )
    power = " kmgt".index((match["unit"] or " ").lower())
    return int(float(match["number"]) * (1 << (10 * power)))


# --- the build profile ---


class MeasuredUnit(Protocol):
    """One compiled translation unit as the preflight reports it."""

    @property
    def peak_rss_bytes(self) -> int: ...

    @property
    def seconds(self) -> float: ...


@dataclass(frozen=True)
class RecipeProfile:
    """What the preflight measured for one recipe's translation units."""

    peak_rss_bytes: int  # the largest peak of the units measured: what one job needs
    seconds: float  # the mean time of a unit
    units: int  # how many were measured
    targets: tuple[str, ...]  # the GPU targets they were compiled for
    measured_under: HostCapacity
    measured_at: str  # UTC, ISO 8601

    @classmethod
    def from_units(cls, units: Iterable[MeasuredUnit], targets: Iterable[str], capacity: HostCapacity) -> RecipeProfile:
        measured = list(units)
        if not measured:
            raise ValueError("a profile needs at least one measured unit")
        return cls(
            peak_rss_bytes=max(unit.peak_rss_bytes for unit in measured),
            seconds=sum(unit.seconds for unit in measured) / len(measured),
            units=len(measured),
            targets=tuple(targets),
            measured_under=capacity,
            measured_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        )

    def jobs(self, recipe: str, capacity: HostCapacity) -> JobsDecision:
        return jobs_for(
            self.peak_rss_bytes,
            capacity,
            measured=f"measured ({recipe} preflight for {', '.join(self.targets) or 'no GPU target'}, {self.measured_at})",
        )


@dataclass(frozen=True)
class BuildProfile:
    """A lock line's build profile: per recipe, what its units were measured to need."""

    line: str
    recipes: dict[str, RecipeProfile] = field(default_factory=dict)
    schema: int = PROFILE_SCHEMA


def profile_path(wheelhouse: Path, line: str) -> Path:
    return wheelhouse / f"build-profile-{line}.json"


def read_profile(wheelhouse: Path, line: str) -> BuildProfile | None:
    """The line's build profile in ``wheelhouse``; None when no preflight has written one."""
    path = profile_path(wheelhouse, line)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(path, "", f"unreadable build profile: {exc}", fix=_REMEASURE) from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != PROFILE_SCHEMA:
        raise ConfigError(
            path, "schema", f"build profile schema {schema!r}, this rocwheels reads {PROFILE_SCHEMA}", fix=_REMEASURE
        )
    if data.get("line") != line:
        raise ConfigError(path, "line", f"a profile of line {data.get('line')!r}, not {line!r}", fix=_REMEASURE)
    return BuildProfile(line, _recipe_profiles(data, path))


def _recipe_profiles(data: dict[str, object], path: Path) -> dict[str, RecipeProfile]:
    """The profile's recipes, each field checked (by hand: the builder image's Python has no pydantic)."""

    def value(table: object, key: str, kind: type | tuple[type, ...], where: str) -> Any:
        item = table.get(key) if isinstance(table, dict) else None
        if not isinstance(item, kind) or isinstance(item, bool):
            raise ConfigError(path, where, f"missing or of the wrong type: {item!r}", fix=_REMEASURE)
        return item

    recipes = {}
    for name, entry in value(data, "recipes", dict, "recipes").items():
        at = f"recipes.{name}"
        peak = value(entry, "peak_rss_bytes", int, f"{at}.peak_rss_bytes")
        if peak <= 0:
            raise ConfigError(path, f"{at}.peak_rss_bytes", f"{peak}: a unit needs some memory", fix=_REMEASURE)
        under = value(entry, "measured_under", dict, f"{at}.measured_under")
        recipes[name] = RecipeProfile(
            peak_rss_bytes=peak,
            seconds=float(value(entry, "seconds", (int, float), f"{at}.seconds")),
            units=value(entry, "units", int, f"{at}.units"),
            targets=tuple(str(target) for target in value(entry, "targets", list, f"{at}.targets")),
            measured_under=HostCapacity(
                value(under, "memory_bytes", int, f"{at}.measured_under.memory_bytes"),
                value(under, "cores", int, f"{at}.measured_under.cores"),
                value(under, "where", str, f"{at}.measured_under.where"),
            ),
            measured_at=value(entry, "measured_at", str, f"{at}.measured_at"),
        )
    return recipes


def record_profile(wheelhouse: Path, line: str, recipe: str, measured: RecipeProfile) -> Path:
    """Keep ``recipe``'s measurement in the line's profile (the other recipes' stay as they were)."""
    current = read_profile(wheelhouse, line) or BuildProfile(line)
    updated = replace(current, recipes={**current.recipes, recipe: measured})
    path = profile_path(wheelhouse, line)
    wheelhouse.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as stream:
        stream.write((json.dumps(asdict(updated), indent=2, sort_keys=True) + "\n").encode())
    return path


_REMEASURE = "delete the file and run the preflight again (rocwheels wheels --preflight)"


# --- /proc and cgroups ---


def _meminfo_available(root: Path) -> int:
    for row in (root / "proc" / "meminfo").read_text().splitlines():
        key, _, value = row.partition(":")
        if key == "MemAvailable":
            return int(value.split()[0]) * 1024  # in kB
    raise OSError(f"no MemAvailable in {root / 'proc' / 'meminfo'}")


def _cgroup_folders(root: Path) -> list[Path]:
    """The cgroup folders whose limits bind this process: its own and its ancestors', v1 or v2.

    Inside a container without a cgroup namespace, /proc/self/cgroup names the host's path while
    the container's own cgroup is mounted at the top: whichever of the path's folders exist count.
    """
    mounts = root / "sys" / "fs" / "cgroup"
    try:
        rows = (root / "proc" / "self" / "cgroup").read_text().splitlines()
    except FileNotFoundError:
        return []
    folders: list[Path] = []
    for row in rows:
        _, controllers, path = row.split(":", 2)
        top = _controller_mount(mounts, controllers)
        if top is None:
            continue
        parts = Path(path).relative_to("/").parts
        folders += [top.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]
    return [folder for folder in dict.fromkeys(folders) if folder.is_dir()]


def _controller_mount(mounts: Path, controllers: str) -> Path | None:
    """Where the hierarchy of a /proc/self/cgroup row is mounted, if it limits memory or cpu."""
    if controllers == "":
        # v2; on a hybrid host (v1 and v2 mounted together) its half limits neither memory nor cpu.
        return mounts if (mounts / "cgroup.controllers").is_file() else None
    names = controllers.split(",")
    if not {"memory", "cpu"} & set(names):
        return None
    return next((mounts / name for name in (controllers, *names) if (mounts / name).is_dir()), None)


def _read(folder: Path, name: str) -> str | None:
    try:
        return (folder / name).read_text().strip()
    except (FileNotFoundError, PermissionError):
        return None


def _cgroup_memory_left(folder: Path) -> int:
    """The memory the cgroup at ``folder`` still allows: its limit less what it uses, page cache it
    can drop not counted as used (as MemAvailable does); unlimited: a very large number."""
    limit_text = _read(folder, "memory.max") or _read(folder, "memory.limit_in_bytes")
    if limit_text is None or limit_text == "max" or int(limit_text) >= _UNLIMITED:
        return _UNLIMITED
    used_text = _read(folder, "memory.current") or _read(folder, "memory.usage_in_bytes") or "0"
    stat = dict(row.split(" ", 1) for row in (_read(folder, "memory.stat") or "").splitlines() if " " in row)
    # v1's usage counts the cgroups below too, as its total_inactive_file does; v2 has inactive_file only.
    droppable = int(stat.get("total_inactive_file", stat.get("inactive_file", "0")))
    return int(limit_text) - max(0, int(used_text) - droppable)


def _cgroup_cpu_quota(folder: Path) -> float | None:
    """CPUs' worth of time the cgroup at ``folder`` allows (1.5: 150 ms per 100 ms); None: no quota."""
    v2 = _read(folder, "cpu.max")
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        return None if quota == "max" else int(quota) / int(period or "100000")
    quota_us, period_us = _read(folder, "cpu.cfs_quota_us"), _read(folder, "cpu.cfs_period_us")
    if quota_us is None or period_us is None or int(quota_us) < 0:
        return None
    return int(quota_us) / int(period_us)
