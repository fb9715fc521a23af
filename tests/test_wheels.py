"""build -> repair -> verify -> wheelhouse for real, with the canary and this host's hipcc."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from pipeline.config.layout import Layout
from pipeline.errors import Interrupted
from pipeline.util.interrupts import interruptible
from pipeline.verify.host_gpus import processor_name
from pipeline.verify.provenance import check_record, record_path
from pipeline.wheel.analyze import analyze_wheel
from pipeline.wheel.archive import split_variant
from pipeline.wheel.variant import read_variant, served_processors
from pipeline.wheels import make_wheels
from tests.helpers import REPO, ROCWHEELS
from tests.helpers.fake_gpu import fake_gpus
from tests.helpers.recipes import canary_plan

pytestmark = pytest.mark.hipcc

# Stand-in GPUs (KFD gfx_target_version) for a host whose GPU the build is not for.
OTHER_GPUS = (110000, 90402, 100300, 90010)


def copy_recipes(dest: Path, smoke_import: str | None = None) -> Path:
    shutil.copytree(REPO / "recipes", dest, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    if smoke_import:
        recipe = dest / "rocm-canary.toml"
        recipe.write_text(recipe.read_text().replace('imports = ["rocm_canary"]', f'imports = ["{smoke_import}"]'))
    return dest


def test_verified_canary_lands_in_the_wheelhouse(tmp_path, host_line, canary_targets):
    layout = Layout(REPO / "recipes", tmp_path / "wheelhouse", tmp_path / "work")
    plan = canary_plan(layout, host_line, canary_targets)
    (outcome,) = make_wheels(plan, layout)
    assert outcome.status == "built", outcome.detail
    # The variant wheel; for the line's default targets (all that hipcc compiles here) also the plain wheel pip takes.
    (variant,) = [w for w in outcome.wheels if split_variant(w.name)[1] is not None]
    wheel = layout.wheelhouse / split_variant(variant.name)[0]
    planned = plan.steps[0].variant
    assert planned is not None
    assert planned.plain == (set(canary_targets) == set(host_line[1].targets))
    assert set(outcome.wheels) == ({variant, wheel} if planned.plain else {variant})
    assert split_variant(variant.name)[1] == planned.label
    if not planned.plain:
        wheel = variant
    assert wheel.parent == layout.wheelhouse
    assert "manylinux" in wheel.name and f"+{host_line[1].local_version}" in wheel.name
    (extension,) = analyze_wheel(wheel).members
    assert set(extension.gpu_targets) == set(canary_targets)
    label = read_variant(variant)
    assert label is not None and label.processors == served_processors(canary_targets)
    log = layout.log_file("rocm-canary").read_text()
    assert "auditwheel verdict" in log and "pip install" in log
    (again,) = make_wheels(plan, layout)
    assert again.status == "up to date" and set(again.wheels) == set(outcome.wheels)
    # Another target set is another variant beside them, never a file of the same name.
    (one,) = make_wheels(canary_plan(layout, host_line, canary_targets[:1]), layout)
    (only,) = one.wheels
    assert split_variant(only.name) == (split_variant(variant.name)[0], canary_targets[0])
    assert set(layout.wheelhouse.glob("*.whl")) == {*outcome.wheels, only}


def test_failed_verification_leaves_the_wheelhouse_empty(tmp_path, host_line, canary_targets):
    layout = Layout(
        copy_recipes(tmp_path / "recipes", smoke_import="rocm_canary.missing"),
        tmp_path / "wheelhouse",
        tmp_path / "work",
    )
    (outcome,) = make_wheels(canary_plan(layout, host_line, canary_targets), layout)
    assert outcome.status == "failed"
    assert "failed verification" in outcome.detail
    assert not list(layout.wheelhouse.glob("*.whl"))
    assert "rocm_canary.missing" in layout.log_file("rocm-canary").read_text()


def test_make_wheels_for_the_canary(tmp_path, host_line, canary_targets):
    """The issue's own command line: make wheels ARCH=... RECIPES=rocm-canary DRIVER=local."""
    env = {
        **os.environ,
        "ROCWHEELS_WHEELHOUSE": str(tmp_path / "wheelhouse"),
        "ROCWHEELS_WORK_DIR": str(tmp_path / "work"),
    }
    result = subprocess.run(
        ["make", "-s", "wheels", f"ARCH={';'.join(canary_targets)}", "RECIPES=rocm-canary", "DRIVER=local"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # The variant wheel of the targets asked for, and the plain wheel when they are all the line's.
    plain = set(canary_targets) == set(host_line[1].targets)
    assert len(list((tmp_path / "wheelhouse").glob("rocm_canary-*manylinux*.whl"))) == (2 if plain else 1)


def test_demo_end_to_end(tmp_path):
    """make demo's job: build, repair, verify, publish to pypiserver, install, smoke test; no server
    left, and the user's wheelhouse as it was."""
    users = tmp_path / "wheelhouse"
    users.mkdir()
    theirs = users / "rocm_canary-0.1.0+rocm5.2-cp311-cp311-manylinux_2_5_x86_64.whl"
    theirs.write_bytes(b"a teammate's verified wheel")
    before = {path.name: path.read_bytes() for path in users.iterdir()}
    env = {
        **os.environ,
        "ROCWHEELS_WHEELHOUSE": str(tmp_path / "wheelhouse"),
        "ROCWHEELS_WORK_DIR": str(tmp_path / "work"),
        "COLUMNS": "200",
    }
    result = subprocess.run([*ROCWHEELS, "demo"], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    for step in ("build, repair, verify", "publish", "install into a fresh venv", "smoke test", "stopped"):
        assert step in result.stdout
    assert "GPU check passed on" in result.stdout or "GPU check not run: " in result.stdout, result.stdout
    # The canary's variant wheel and, built for every target of the line, its plain wheel.
    assert re.search(r"[12] uploaded, 0 already there", result.stdout), result.stdout
    servers = subprocess.run(
        ["pgrep", "-f", "pypiserver(_records)? run .*rocwheels-demo-"], capture_output=True, text=True
    )
    assert servers.stdout == "", "a process of the demo is still running"
    assert {path.name: path.read_bytes() for path in users.iterdir()} == before
    assert list((tmp_path / "work" / "demo" / "wheelhouse").glob("rocm_canary-*.whl"))


def test_a_signal_as_the_wheels_move_in_leaves_each_with_its_record(
    tmp_path: Path, host_line, canary_targets: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C just as the first wheel takes its name in the wheelhouse: the wheels and their provenance
    records land together (the signal waits for the renames) and the run then stops, so no wheel lies
    there without its record, and the next run finds them up to date."""
    layout = Layout(REPO / "recipes", tmp_path / "wheelhouse", tmp_path / "work")
    plan = canary_plan(layout, host_line, canary_targets)
    real_replace, signalled = Path.replace, list[str]()

    def replace_then_signal(source: Path, target: str | os.PathLike[str]) -> Path:
        moved = real_replace(source, target)
        final = Path(target)
        if final.parent == layout.wheelhouse and final.suffix == ".whl" and not signalled:
            signalled.append(final.name)
            os.kill(os.getpid(), signal.SIGINT)
        return moved

    monkeypatch.setattr(Path, "replace", replace_then_signal)
    with pytest.raises(Interrupted), interruptible():
        make_wheels(plan, layout)
    monkeypatch.undo()
    assert signalled, "no wheel was moved into the wheelhouse"
    wheels = sorted(layout.wheelhouse.glob("*.whl"))
    assert wheels and all(record_path(wheel).is_file() and check_record(wheel)[0] for wheel in wheels), wheels
    assert [p.name for p in layout.wheelhouse.iterdir() if p.name.startswith(".")] == []
    (again,) = make_wheels(plan, layout)
    assert again.status == "up to date" and set(again.wheels) == set(wheels)


def test_a_build_host_whose_gpu_is_not_a_target_still_builds(
    tmp_path: Path,
    host_line,
    canary_targets: tuple[str, ...],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """CI builds for the fleet's GPUs on a runner with another one: the canary's GPU check (a kernel
    launch) cannot run there and is skipped, saying so, instead of failing the wheel."""
    elsewhere = next(version for version in OTHER_GPUS if processor_name(version) not in canary_targets)
    fake_gpus(tmp_path / "gpu", monkeypatch, elsewhere)
    layout = Layout(REPO / "recipes", tmp_path / "wheelhouse", tmp_path / "work")
    with caplog.at_level("INFO", logger="rocwheels"):
        (outcome,) = make_wheels(canary_plan(layout, host_line, canary_targets), layout)
    assert outcome.status == "built", outcome.detail
    assert f"GPU check not run: the wheel has no code for {processor_name(elsewhere)} here" in caplog.text
