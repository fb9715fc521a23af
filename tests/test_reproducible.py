"""Reproducible wheels: the same inputs give the same bytes, whichever folder and whenever they are
built, with either driver; a publish of such a rebuild uploads nothing and succeeds."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from pipeline.build.container import container_driver
from pipeline.build.engine import Engine
from pipeline.config.layout import Layout
from pipeline.publish.serve import add_htpasswd_user, running_pypiserver
from pipeline.wheel.zipwrite import ZIP_EPOCH, epoch_time, write_wheel
from pipeline.wheels import make_wheels
from tests.helpers import REPO, ROCWHEELS
from tests.helpers.recipes import canary_plan, debian13_plan


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def recipes_touched_at(dest: Path, when: float) -> Path:
    """A copy of the recipes whose files all carry the modification time ``when`` (another checkout, another day)."""
    shutil.copytree(REPO / "recipes", dest, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    for path in dest.rglob("*"):
        os.utime(path, (when, when))
    return dest


def clean_builds(tmp_path: Path, build) -> list[list[Path]]:
    """The canary built twice from nothing: other recipe copy, work folder and wheelhouse, the clock
    moved on; each build's files (its variant wheel, and its plain wheel for the line's targets)."""
    builds = []
    for turn, when in enumerate((time.time() - 86400 * 30, time.time())):
        root = tmp_path / f"build{turn}"
        layout = Layout(recipes_touched_at(root / "recipes", when), root / "wheelhouse", root / f"work-{turn}")
        (outcome,) = build(layout, turn)
        assert outcome.status == "built", f"{outcome.detail}\n{layout.log_file('rocm-canary').read_text()[-3000:]}"
        builds.append(sorted(outcome.wheels))
        time.sleep(2.5)  # past zip's two-second clock
    return builds


def assert_identical(first: list[Path], second: list[Path]) -> None:
    assert [wheel.name for wheel in first] == [wheel.name for wheel in second]
    assert [sha256(wheel) for wheel in first] == [sha256(wheel) for wheel in second]


@pytest.mark.hipcc
@pytest.mark.network
def test_two_local_builds_are_byte_identical_and_the_rebuild_publishes_nothing(
    tmp_path: Path, host_line, canary_targets
) -> None:
    first, second = clean_builds(
        tmp_path, lambda layout, _: make_wheels(canary_plan(layout, host_line, canary_targets), layout)
    )
    assert_identical(first, second)
    for wheel in first:
        with zipfile.ZipFile(wheel) as archive:
            assert {info.date_time for info in archive.infolist()} == {epoch_time(ZIP_EPOCH)}

    add_htpasswd_user(tmp_path / "htpasswd", "builder", "pw")
    env = {**os.environ, "TWINE_USERNAME": "builder", "TWINE_PASSWORD": "pw"}
    with running_pypiserver(tmp_path / "packages", tmp_path / "htpasswd", log_file=tmp_path / "index.log") as index:
        for house, uploaded in (
            (first[0].parent, f"{len(first)} uploaded, 0 already there"),
            (second[0].parent, f"0 uploaded, {len(second)} already there"),
        ):
            result = subprocess.run(
                [*ROCWHEELS, "--wheelhouse", house, "publish", "--repository", index.url],
                env=env,
                capture_output=True,
                text=True,
            )
            assert result.returncode == 0, result.stderr[-3000:]
            assert uploaded in result.stdout, result.stdout
    assert sorted(p.name for p in (tmp_path / "packages").glob("*.whl")) == [wheel.name for wheel in first]


@pytest.mark.container
def test_two_container_builds_are_byte_identical(
    podman_engine: Engine, trixie_base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def build(layout: Layout, turn: int):
        # Each its own compiler cache: both builds compile.
        monkeypatch.setenv("ROCWHEELS_CCACHE_DIR", str(tmp_path / f"ccache-{turn}"))
        plan = debian13_plan(layout, builder_image=trixie_base)
        return make_wheels(plan, layout, container_driver(plan, layout, engine=podman_engine))

    first, second = clean_builds(tmp_path, build)
    assert_identical(first, second)


def test_repair_writes_the_epoch_and_fixed_permissions_whatever_the_build_wrote(tmp_path: Path) -> None:
    """A build backend that ignores SOURCE_DATE_EPOCH, or another umask: the written wheels are equal anyway."""
    written = []
    for turn, (when, mode) in enumerate((((2024, 5, 1, 10, 0, 0), 0o664), ((2026, 1, 2, 3, 4, 6), 0o600))):
        source = tmp_path / f"raw{turn}" / "pkg-1.0-py3-none-any.whl"
        source.parent.mkdir()
        with zipfile.ZipFile(source, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data, executable in (
                ("pkg/__init__.py", b"", False),
                ("pkg/tool", b"#!/bin/sh\n", True),
                ("pkg-1.0.dist-info/RECORD", b"", False),
            ):
                info = zipfile.ZipInfo(name, date_time=when)
                info.external_attr = (0o100000 | mode | (0o100 if executable else 0)) << 16
                archive.writestr(info, data)
        written.append(
            write_wheel(
                source,
                tmp_path / f"out{turn}" / source.name,
                record="pkg-1.0.dist-info/RECORD",
                changed={"pkg/__init__.py": b"# repaired\n"},
                source_date_epoch=1700000000,
            )
        )
    assert written[0].read_bytes() == written[1].read_bytes()
    with zipfile.ZipFile(written[0]) as archive:
        assert {info.date_time for info in archive.infolist()} == {(2023, 11, 14, 22, 13, 20)}
        assert {info.filename: oct(info.external_attr >> 16) for info in archive.infolist()} == {
            "pkg/__init__.py": "0o100644",
            "pkg/tool": "0o100755",
            "pkg-1.0.dist-info/RECORD": "0o100644",
        }
