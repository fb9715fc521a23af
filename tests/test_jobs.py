"""Compile jobs sized by measured memory: the capacity where a build runs, the decision, the line's build profile."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.build.container import cibuildwheel_env
from pipeline.build.engine import Engine
from pipeline.build.jobs import (
    ASSUMED_PEAK_BYTES,
    BuildProfile,
    HostCapacity,
    RecipeProfile,
    container_capacity,
    decide_jobs,
    jobs_for,
    parse_size,
    profile_path,
    read_profile,
    record_profile,
)
from pipeline.config.layout import Layout
from pipeline.errors import ConfigError, InputError
from pipeline.plan import describe, select_plan
from pipeline.publish.admission import admit_wheels
from pipeline.publish.index import scan_wheels
from tests.helpers import REPO
from tests.helpers.containers import cibuildwheel_reads, python_in
from tests.helpers.hip import KERNEL
from tests.helpers.recipes import DEBIAN13_TARGETS, debian13_plan, lock_toml, recipe_toml, recipes_plan

GiB = 1 << 30
UNLIMITED_V1 = "9223372036854771712"


def fake_root(tmp_path: Path, cgroup: str, files: dict[str, str], available_kb: int = 16 * 1024 * 1024) -> Path:
    """A root with /proc/meminfo, /proc/self/cgroup and the cgroup files given (path -> text)."""
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "meminfo").write_text(
        f"MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   {available_kb} kB\n"
    )
    (tmp_path / "proc" / "self" / "cgroup").write_text(cgroup)
    for name, text in files.items():
        path = tmp_path / "sys" / "fs" / "cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


# --- HostCapacity against fake /proc and cgroup files ---


def test_no_cgroup_limits_leaves_meminfo_and_affinity(tmp_path):
    root = fake_root(tmp_path, "0::/\n", {"cgroup.controllers": "cpu memory\n", "memory.max": "max\n"})
    assert HostCapacity.measure(root, affinity=8) == HostCapacity(16 * GiB, 8)


def test_cgroup_v2_limit_less_usage_bounds_memory_and_quota_bounds_cores(tmp_path):
    root = fake_root(
        tmp_path,
        "0::/build.slice/job\n",
        {
            "cgroup.controllers": "cpu memory\n",
            "build.slice/job/memory.max": f"{4 * GiB}\n",
            "build.slice/job/memory.current": f"{2 * GiB}\n",
            # Page cache the kernel can drop is not used memory (MemAvailable counts it as available).
            "build.slice/job/memory.stat": f"anon 123\ninactive_file {GiB}\n",
            "build.slice/job/cpu.max": "150000 100000\n",
        },
    )
    assert HostCapacity.measure(root, affinity=8) == HostCapacity(3 * GiB, 2)


def test_cgroup_v2_parent_limit_binds_too(tmp_path):
    root = fake_root(
        tmp_path,
        "0::/outer/inner\n",
        {
            "cgroup.controllers": "memory\n",
            "outer/memory.max": f"{GiB}\n",
            "outer/memory.current": "0\n",
            "outer/inner/memory.max": "max\n",
        },
    )
    assert HostCapacity.measure(root, affinity=4).memory_bytes == GiB


def test_cgroup_v1_in_a_container_reads_its_own_mount(tmp_path):
    # Inside a container without a cgroup namespace /proc/self/cgroup names the host's path, and
    # the container's own cgroup is what is mounted (as podman does on this Debian 12 host).
    root = fake_root(
        tmp_path,
        "4:memory:/libpod_parent/libpod-abc\n1:cpu,cpuacct:/libpod_parent/libpod-abc\n0::/libpod_parent/libpod-abc\n",
        {
            "memory/memory.limit_in_bytes": f"{700 << 20}\n",
            "memory/memory.usage_in_bytes": f"{100 << 20}\n",
            "memory/memory.stat": f"inactive_file 999\ntotal_inactive_file {50 << 20}\n",
            "cpu,cpuacct/cpu.cfs_quota_us": "100000\n",
            "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
    )
    assert HostCapacity.measure(root, affinity=2) == HostCapacity(650 << 20, 1)


def test_cgroup_v1_unlimited_is_no_limit(tmp_path):
    root = fake_root(
        tmp_path,
        "4:memory:/process_api/x\n2:cpu:/\n",
        {
            "memory/memory.limit_in_bytes": UNLIMITED_V1,
            "memory/process_api/x/memory.limit_in_bytes": UNLIMITED_V1,
            "cpu/cpu.cfs_quota_us": "-1\n",
            "cpu/cpu.cfs_period_us": "100000\n",
        },
    )
    assert HostCapacity.measure(root, affinity=2) == HostCapacity(16 * GiB, 2)


def test_this_host_is_measured():
    capacity = HostCapacity.measure()
    assert capacity.memory_bytes > 0 and capacity.cores >= 1


@pytest.mark.parametrize("memory", ["700m", "1g"])
def test_a_container_with_a_memory_limit_sees_it(podman_engine, sid_base, memory):
    code = "from pipeline.build.jobs import HostCapacity as H; c = H.measure(); print(c.memory_bytes, c.cores)"
    output = python_in(podman_engine, sid_base, code, limits=("--memory", memory, "--cpus", "1"))
    memory_bytes, cores = map(int, output.split()[-2:])
    limit = parse_size(memory, "--memory")
    # The limit less what python3 itself uses (some MB).
    assert limit - (64 << 20) < memory_bytes <= limit
    assert cores == 1


# --- jobs_for ---


def test_memory_limits_and_the_note_says_so():
    capacity = HostCapacity(int(3.1 * GiB), 8)
    decision = jobs_for(int(1.4 * GiB), capacity, headroom=0, measured="measured (flash-attention preflight)")
    assert decision.jobs == 2
    assert decision.note == (
        "2 jobs, not 8: 3.1 GiB available on this host, 1.4 GiB per unit measured (flash-attention preflight)"
    )


def test_cores_limit_without_a_note():
    decision = jobs_for(GiB, HostCapacity(64 * GiB, 4))
    assert (decision.jobs, decision.note) == (4, "")


def test_one_unit_larger_than_the_memory_gets_one_job_and_a_warning():
    decision = jobs_for(8 * GiB, HostCapacity(3 * GiB, 16))
    assert decision.jobs == 1
    assert "even that may run out of memory" in decision.note and "8.0 GiB per unit" in decision.note


@given(
    peak=st.integers(min_value=1, max_value=1 << 40),
    memory=st.integers(min_value=0, max_value=1 << 42),
    cores=st.integers(min_value=1, max_value=512),
    headroom=st.floats(min_value=0, max_value=0.9),
)
def test_jobs_are_between_one_and_the_cores_and_fit_in_memory(peak, memory, cores, headroom):
    decision = jobs_for(peak, HostCapacity(memory, cores), headroom=headroom)
    usable = int(memory * (1 - headroom))
    assert 1 <= decision.jobs <= cores
    assert decision.jobs == 1 or decision.jobs * peak <= usable
    assert bool(decision.note) == (decision.jobs < cores or peak > usable)


def test_a_peak_of_nothing_is_refused():
    with pytest.raises(ValueError, match="must be positive"):
        jobs_for(0, HostCapacity(GiB, 1))


def test_asked_jobs_win_then_the_profile_then_the_assumed_8_gb():
    capacity = HostCapacity(20 * GiB, 8)
    profile = BuildProfile("l", {"fa": measured(peak=4 * GiB)})
    assert decide_jobs("fa", 7, profile, capacity).jobs == 7
    assert decide_jobs("fa", None, profile, capacity).jobs == 4  # 20 GiB less 20% headroom, 4 GiB each
    assert decide_jobs("torch", None, profile, capacity).jobs == 20 * GiB // ASSUMED_PEAK_BYTES
    assert "no build profile" in decide_jobs("torch", None, None, capacity).note


def test_container_memory_setting_bounds_the_capacity():
    host = HostCapacity(20 * GiB, 8)
    assert container_capacity(host, {}).memory_bytes == 20 * GiB
    limited = container_capacity(host, {"ROCWHEELS_CONTAINER_MEMORY": "6g"})
    assert limited.memory_bytes == 6 * GiB and "--memory 6g" in limited.where
    assert container_capacity(HostCapacity(GiB, 2), {"ROCWHEELS_CONTAINER_MEMORY": "6g"}).memory_bytes == GiB
    with pytest.raises(InputError, match="ROCWHEELS_CONTAINER_MEMORY='lots'"):
        container_capacity(host, {"ROCWHEELS_CONTAINER_MEMORY": "lots"})


def test_the_container_memory_setting_reaches_the_engine(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCWHEELS_CONTAINER_MEMORY", "6g")
    layout = Layout(REPO / "recipes", tmp_path / "wheelhouse", tmp_path / "work")
    plan = debian13_plan(layout)
    engine = Engine("podman", ("/nonexistent/podman",))
    settings = cibuildwheel_env(plan, plan.steps[0], engine=engine, image="x", ccache=tmp_path, gpu=False)
    build = cibuildwheel_reads(settings, tmp_path)[1]
    assert "--memory=6g" in build.container_engine.create_args


@pytest.mark.parametrize(("text", "size"), [("700m", 700 << 20), ("1g", GiB), ("8GiB", 8 * GiB), ("1024", 1024)])
def test_sizes_read_as_podman_reads_them(text, size):
    assert parse_size(text, "x") == size


# --- the build profile ---


@dataclass(frozen=True)
class Unit:
    peak_rss_bytes: int
    seconds: float


def measured(peak: int = 2 * GiB) -> RecipeProfile:
    return RecipeProfile.from_units(
        [Unit(peak // 2, 10.0), Unit(peak, 30.0)], ("gfx942",), HostCapacity(16 * GiB, 2, "in the builder container")
    )


def test_profile_round_trip_keeps_other_recipes(tmp_path):
    first, second = measured(), measured(3 * GiB)
    record_profile(tmp_path, "debian-sid", "flash-attention", first)
    path = record_profile(tmp_path, "debian-sid", "torch", second)
    assert path == profile_path(tmp_path, "debian-sid") == tmp_path / "build-profile-debian-sid.json"
    assert read_profile(tmp_path, "debian-sid") == BuildProfile(
        "debian-sid", {"flash-attention": first, "torch": second}
    )
    assert first.peak_rss_bytes == 2 * GiB and first.seconds == 20.0 and first.units == 2
    assert json.loads(path.read_text())["schema"] == 1
    assert not list(tmp_path.glob(".*partial"))  # written through atomic_write


def test_no_profile_is_none(tmp_path):
    assert read_profile(tmp_path, "l") is None


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("{", ""),
        ('{"schema": 99, "line": "l"}', "schema"),
        ('{"schema": 1, "line": "l", "recipes": {"fa": {"peak_rss_bytes": "lots"}}}', "recipes.fa.peak_rss_bytes"),
        ('{"schema": 1, "line": "l", "recipes": {"fa": {"peak_rss_bytes": 0}}}', "recipes.fa.peak_rss_bytes"),
        ('{"schema": 1, "line": "other"}', "line"),
    ],
)
def test_a_damaged_profile_names_file_field_and_fix(tmp_path, text, field):
    profile_path(tmp_path, "l").write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_profile(tmp_path, "l")
    assert caught.value.file == str(profile_path(tmp_path, "l")) and caught.value.field == field
    assert "--preflight" in (caught.value.fix or "")


def test_publishing_ignores_the_profile_beside_the_wheels(tmp_path):
    record_profile(tmp_path, "l", "fa", measured())
    assert scan_wheels(tmp_path) == ()
    assert admit_wheels(tmp_path, None).admitted == ()


# --- a plan with a profile ---

LOCK = lock_toml({"fa": "1.0"}, targets=("gfx942",))


def test_a_plan_on_a_small_host_gets_fewer_jobs_and_says_why(tmp_path):
    (tmp_path / "fa.toml").write_text(recipe_toml("fa", env={"MAX_JOBS": "{jobs}"}))
    (tmp_path / "lock.toml").write_text(LOCK)
    profile = BuildProfile("l", {"fa": measured(peak=2 * GiB)})

    def plan(capacity: HostCapacity, jobs: int | None = None):
        return recipes_plan(tmp_path, ["fa"], "l", "gfx942", jobs=jobs, profile=profile, capacity=capacity)

    (large,) = plan(HostCapacity(64 * GiB, 8)).steps
    assert (large.jobs, large.env["MAX_JOBS"], large.jobs_note) == (8, "8", "")
    small_plan = plan(HostCapacity(5 * GiB, 8))
    (small,) = small_plan.steps
    assert (small.jobs, small.env["MAX_JOBS"]) == (2, "2")
    assert small.jobs_note.startswith(
        "2 jobs, not 8: 5.0 GiB available on this host, 2.0 GiB per unit measured (fa preflight for gfx942"
    )
    assert f"compile jobs: {small.jobs_note}" in describe(small_plan)
    (asked,) = plan(HostCapacity(5 * GiB, 8), jobs=6).steps
    assert (asked.jobs, asked.jobs_note) == (6, "")


def test_a_container_plan_reads_the_lines_profile_from_the_wheelhouse(tmp_path, monkeypatch):
    """As `rocwheels plan --driver container` resolves it: the profile in the wheelhouse, sized for
    the container's memory limit."""
    monkeypatch.setenv("ROCWHEELS_CONTAINER_MEMORY", "2g")
    layout = Layout(REPO / "recipes", tmp_path / "wheelhouse", tmp_path / "work")
    record_profile(layout.wheelhouse, "debian13", "rocm-canary", measured(peak=GiB))
    plan = select_plan(layout, "rocm-canary", ";".join(DEBIAN13_TARGETS), "debian13", "container")
    (step,) = plan.steps
    cores = HostCapacity.measure().cores
    assert step.jobs == 1  # 2 GiB less the headroom holds one unit of 1 GiB
    if cores > 1:  # memory, not cores, decided: the note says so
        assert step.jobs_note.startswith(f"1 job, not {cores}: ")
        assert (
            "in the builder container (--memory 2g), 1.0 GiB per unit measured (rocm-canary preflight" in step.jobs_note
        )


# Inside the container: compile a HIP unit, measure its peak memory as the preflight does (the
# largest child's peak RSS), keep it in the build profile at /work and decide the jobs there.
MEASURE_AND_DECIDE = """
import json, pathlib, resource, subprocess
from pipeline.build.jobs import HostCapacity, RecipeProfile, record_profile
subprocess.run(["hipcc", "-x", "hip", "-c", "--offload-arch=gfx942", "-O3", "k.hip", "-o", "k.o"], check=True)
class Unit:
    peak_rss_bytes = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    seconds = 1.0
capacity = HostCapacity.measure()
profile = RecipeProfile.from_units([Unit()], ["gfx942"], capacity)
record_profile(pathlib.Path("/work/wheelhouse"), "debian-sid", "toy", profile)
decision = profile.jobs("toy", capacity)
print(json.dumps([decision.jobs, decision.note]))
"""


def test_a_container_with_less_memory_gets_fewer_jobs_for_a_measured_unit(podman_engine, sid_base, tmp_path):
    (tmp_path / "k.hip").write_text(KERNEL)

    def measured_in(memory: str) -> tuple[int, str]:
        output = python_in(
            podman_engine, sid_base, MEASURE_AND_DECIDE, limits=("--memory", memory, "--cpus", "2"), work=tmp_path
        )
        jobs, note = json.loads(output.splitlines()[-1])
        return jobs, note

    assert measured_in("2g") == (2, "")  # clang needs ~150 MB for this unit: the 2 cores decide
    jobs, note = measured_in("256m")
    assert jobs == 1 and note.startswith("1 job, not 2: 0.2 GiB available") and "(toy preflight for gfx942" in note
    profile = read_profile(tmp_path / "wheelhouse", "debian-sid")
    assert profile is not None and profile.recipes["toy"].measured_under.memory_bytes <= 256 << 20
