"""`rocwheels wheels --preflight`: the canary's units compiled and measured on this host and in the
builder image, a unit stopped at its time limit, a recipe that cannot say how it compiles, bad
[preflight] data, and a signal during a compile that leaves no compiler behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.build.jobs import read_profile
from pipeline.config.layout import Layout
from pipeline.config.lock import load_lock
from pipeline.config.recipes import load_recipe
from pipeline.errors import ConfigError
from pipeline.preflight.drivers import log_path, preflight_plan, report_path
from pipeline.preflight.report import NOT_DESCRIBED, Group, RecipePreflight, UnitResult, UnitStatus, project
from tests.helpers import REPO
from tests.helpers.preflight import SLOW_COMPILER, alive, recipes_with_compiler, rocwheels_preflight, start_preflight
from tests.helpers.project import small_project
from tests.helpers.recipes import canary_plan, line_plan, recipes_plan
from tests.helpers.waiting import wait_for


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(REPO / "recipes", tmp_path / "wheelhouse", tmp_path / "work")


def canary_checked(report: RecipePreflight, targets: tuple[str, ...]) -> None:
    """The canary's one unit compiled for each target, measured, its object holding that target's code."""
    assert report.ok, report.model_dump_json(indent=2)
    assert [step.name for step in report.steps] == ["source", "build requirements", "sample compiles"]
    assert [(unit.unit, unit.target) for unit in report.units] == [("src/rocm_canary/_canary.hip", t) for t in targets]
    for unit in report.units:
        assert unit.status == "compiled" and unit.code_objects == (unit.target,)
        assert unit.seconds > 0 and unit.peak_rss_bytes > 20 << 20, "a compiler's own peak, not the wrapper's"
        assert f"--offload-arch={unit.target}" in unit.command and unit.command.startswith("hipcc ")
    assert report.projection is not None and report.projection.units == 1 and not report.projection.lower_bound
    assert report.projection.peak_rss_bytes == max(unit.peak_rss_bytes for unit in report.units)
    # The jobs its measured peak allows where it compiled, and the cache's second pass served all.
    assert report.sizing is not None and 1 <= report.sizing.jobs <= report.sizing.capacity.cores
    assert report.cache is not None and report.cache.compiles == len(targets), report.cache
    assert report.cache.hit_rate == 1.0, report.cache.note


def profile_kept(layout: Layout, report: RecipePreflight) -> None:
    """The line's build profile in the wheelhouse holds what the preflight measured: the next build's jobs."""
    profile = read_profile(layout.wheelhouse, report.line)
    assert profile is not None
    measured = profile.recipes["rocm-canary"]
    assert measured.peak_rss_bytes == max(unit.peak_rss_bytes for unit in report.units)
    assert measured.targets == report.targets


def test_canary_preflight_on_this_host(layout: Layout, host_line, canary_targets: tuple[str, ...]) -> None:
    targets = canary_targets[:2]
    (report,) = preflight_plan(canary_plan(layout, host_line, targets), layout, "local")
    canary_checked(report, targets)
    profile_kept(layout, report)
    assert RecipePreflight.read(report_path(layout, "rocm-canary")) == report
    log = log_path(layout, "rocm-canary").read_text()
    assert "# src/rocm_canary/_canary.hip for" in log and "pip install" in log


def test_a_unit_past_its_time_limit_is_stopped_and_named(
    tmp_path: Path, host_line, canary_targets: tuple[str, ...]
) -> None:
    result = rocwheels_preflight(
        tmp_path, REPO / "recipes", host_line[0], canary_targets[0], "--unit-time-limit", "0.01"
    )
    assert result.returncode == 1, result.stderr
    report = RecipePreflight.read(tmp_path / "wheelhouse" / "logs" / "rocm-canary.preflight.json")
    (unit,) = report.units
    assert unit.status == "stopped" and not report.ok
    assert (
        unit.detail.startswith("stopped after 0.01 s: hipcc ") and f"--offload-arch={canary_targets[0]}" in unit.detail
    )
    assert f"_canary.hip for {canary_targets[0]}: stopped after 0.01 s: hipcc " in result.stderr
    assert "preflight failed for rocm-canary" in result.stderr
    assert (
        "--require-hashes"
        in log_path(Layout(REPO / "recipes", tmp_path / "wheelhouse", tmp_path), "rocm-canary").read_text()
    )


def test_a_recipe_without_preflight_data_says_so(tmp_path: Path) -> None:
    """Preflighted up to its compilation; beta's dependency alpha is not built yet (CI's first stage),
    so its build environment goes without it, and the report says that too."""
    project = small_project(tmp_path)
    layout = Layout(project.recipes, project.wheelhouse, project.work)
    line = load_lock(project.recipes).line("rocm9.9")
    plan = recipes_plan(project.recipes, ["beta"], ("rocm9.9", line), "gfx90a")
    alpha, beta = preflight_plan(plan, layout, "local")
    for report in (alpha, beta):
        assert report.ok and report.units == () and report.projection is None
        assert [(step.name, step.status) for step in report.steps] == [
            ("source", "done"),
            ("build requirements", "done"),
        ]
    assert alpha.note == NOT_DESCRIBED
    assert beta.note.startswith(NOT_DESCRIBED + "; built without alpha==1.0+rocm9.9 (not in the wheelhouse yet)")


@pytest.mark.parametrize(
    ("table", "field", "said"),
    [
        ('units = ["/src/*.cpp"]', "preflight.units.0", "relative to the source folder"),
        ('units = ["../x/*.cpp"]', "preflight.units.0", "without '..'"),
        ("units = []", "preflight.units", "name the globs of every translation unit"),
        ('units = ["*.cpp"]\nflags = ["--offload-arch={arch}"]', "preflight.flags[0]", "unknown placeholder {arch}"),
        ('units = ["*.cpp"]\ngenerate = ["gen {target}"]', "preflight.generate[0]", "unknown placeholder {target}"),
        ('units = ["*.cpp"]\nunit_time_limit = 0', "preflight.unit_time_limit", "greater than 0"),
        ('units = ["*.cpp"]\nlanguage = "cuda"', "preflight.language", "'hip'"),
        (
            'units = ["*.cpp"]\nsample = [{name = "a", units = "*.cpp", count = 0}]',
            "preflight.sample.0.count",
            "greater than 0",
        ),
        (
            'units = ["*.cpp"]\nsample = [{name = "a", units = "*"}, {name = "a", units = "*"}]',
            "preflight.sample",
            "names must differ",
        ),
        ('units = ["*.cpp"]\nunits_glob = "x"', "preflight.units_glob", "unknown key"),
    ],
)
def test_bad_preflight_data_names_file_and_field(tmp_path: Path, table: str, field: str, said: str) -> None:
    project = small_project(tmp_path)
    path = project.recipe("alpha", (project.recipes / "alpha.toml").read_text() + f"[preflight]\n{table}\n")
    with pytest.raises(ConfigError) as error:
        load_recipe(path)
    assert error.value.file == str(path) and error.value.field == field, error.value
    assert said in str(error.value)


def test_the_projection_spreads_each_group_over_the_jobs() -> None:
    def unit(group: str, target: str, seconds: float, peak: int, status: UnitStatus = "compiled") -> UnitResult:
        return UnitResult(
            unit=f"{group}.cpp",
            group=group,
            target=target,
            status=status,
            seconds=seconds,
            peak_rss_bytes=peak,
            command="cc",
        )

    groups = [Group(name="fwd", units=100, sampled=("fwd.cpp",)), Group(name="bwd", units=50, sampled=("bwd.cpp",))]
    units = [unit("fwd", "gfx90a", 10, 1 << 30), unit("fwd", "gfx942", 20, 2 << 30), unit("bwd", "gfx942", 60, 3 << 30)]
    projection = project([*groups, Group(name="rest", units=10)], units, jobs=8)
    assert projection is not None
    # fwd: 100 x (10 + 20) s, bwd: 50 x 60 s, rest: 10 x the mean of the two (45 s); over 8 jobs.
    assert projection.seconds == pytest.approx((3000 + 3000 + 450) / 8)
    assert projection.peak_rss_bytes == 8 * (3 << 30) and projection.units == 160
    assert not projection.lower_bound and "rest: 10 units not sampled" in projection.notes[0]
    stopped = project(groups, [*units[:2], unit("bwd", "gfx942", 600, 1 << 30, "stopped")], jobs=8)
    assert stopped is not None and stopped.lower_bound and stopped.notes[0].startswith("bwd: not every sample unit")
    assert project(groups, [unit("fwd", "gfx942", 1, 1, "failed")], jobs=8) is None


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_during_a_unit_compile_leaves_no_process(
    tmp_path: Path, host_line, canary_targets: tuple[str, ...], stop: signal.Signals
) -> None:
    """Ctrl-C (SIGINT to the terminal's process group: rocwheels and the unit's wrapper) or a CI cancel
    (SIGTERM to rocwheels alone) while a unit compiles: the compiler and its children are gone too."""
    recipes = recipes_with_compiler(tmp_path / "recipes", SLOW_COMPILER)
    pids = tmp_path / "compiler.pids"
    process = start_preflight(tmp_path, recipes, host_line[0], canary_targets[0], env={"SLOW_COMPILER_PIDS": str(pids)})
    wait_for(lambda: process.poll() is not None or len(_read_pids(pids)) == 2, "the compile starts", timeout=300)
    assert process.poll() is None, process.communicate()
    if stop == signal.SIGINT:
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + stop, err
    assert "Traceback" not in err
    wait_for(lambda: not any(alive(pid) for pid in _read_pids(pids)), "the compiler and its child end", timeout=10)


def _read_pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@pytest.mark.parametrize("line", ["debian13"])
def test_canary_preflight_in_the_builder_image(podman_engine, trixie_base: str, layout: Layout, line: str) -> None:
    targets = ("gfx942", "gfx90a")
    plan = line_plan(layout, line, targets, builder_image=trixie_base)
    (report,) = preflight_plan(plan, layout, "container", engine=podman_engine)
    canary_checked(report, targets)
    profile_kept(layout, report)
    assert report.sizing is not None and report.sizing.capacity.where.startswith("in the builder container")
    assert (
        "rocwheels preflight-job /project/.rocwheels/preflight-job.json" in log_path(layout, "rocm-canary").read_text()
    )
    # Where the job ran: the image's own Python made the build environment.
    assert json.loads(
        (layout.recipe_work("rocm-canary") / "preflight" / ".rocwheels" / "preflight-job.json").read_text()
    )["python"].startswith("/opt/python/cp313")


def test_the_wrapper_measures_its_command_alone(tmp_path: Path) -> None:
    """The wrapper alone: the exit status, output and peak memory of a command holding 64 MB."""
    result, log = tmp_path / "r.json", tmp_path / "l.log"
    code = "b = bytearray(64 << 20); print('held')"
    subprocess.run(
        [sys.executable, "-m", "pipeline.preflight.measure", result, log, "30", "--", sys.executable, "-c", code],
        check=True,
    )
    measured = json.loads(result.read_text())
    assert measured["returncode"] == 0 and not measured["stopped"] and log.read_text() == "held\n"
    assert 64 << 20 < measured["peak_rss_bytes"] < 200 << 20
