"""flash-attention's real CK kernels, compiled by the preflight in the Debian sid builder base.

The 2.8.3.post2 sdist from PyPI (cached once), its kernel generator run as setup.py runs it, then
the cheapest forward and backward kernel units compiled for gfx942 with the recipe's flags by
Debian sid's hipcc 7 (clang 21), in a container limited to 700 MB: the jobs the measured peak
allows there are fewer than its cores, and say why. Each object's code objects are read by
verify's reader. The attention kernels themselves take minutes to hours per unit (see
recipes/flash-attention.toml), which is why the recipe samples the cheapest ones.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.build.jobs import CONTAINER_MEMORY, read_profile
from pipeline.config.layout import Layout
from pipeline.config.lock import load_lock
from pipeline.preflight.drivers import preflight_plan
from tests.helpers import REPO
from tests.helpers.recipes import recipes_plan

VERSION = "2.8.3.post2"
LIMIT = "700m"  # a unit peaks at about 0.4 GB here: room for one job, not two


@pytest.mark.slow
@pytest.mark.network  # the sdist comes from PyPI once, its build requirements from the line's constraints
def test_flash_attention_ck_units_compile_in_the_sid_base(
    podman_engine, sid_base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipes = REPO / "recipes"
    line = load_lock(recipes).line("debian-sid")
    line = line.model_copy(
        update={
            "builder_image": sid_base,
            "versions": {**line.versions, "torch": "2.14.1", "flash-attention": VERSION},
        }
    )
    plan = recipes_plan(recipes, ["flash-attention"], ("debian-sid", line), "gfx942", driver="container")
    # torch is built from GitHub's sources, which this machine cannot reach; flash-attention's
    # kernel units do not include its headers.
    plan = replace(plan, steps=tuple(step for step in plan.steps if step.name == "flash-attention"))
    layout = Layout(recipes, tmp_path / "wheelhouse", tmp_path / "work")
    monkeypatch.setenv(CONTAINER_MEMORY, LIMIT)
    (report,) = preflight_plan(plan, layout, "container", engine=podman_engine)

    assert report.ok, report.model_dump_json(indent=2)
    assert [s.name for s in report.steps] == ["source", "build requirements", "generate", "sample compiles"]
    assert {(u.group, u.target) for u in report.units} == {
        ("forward kernels", "gfx942"),
        ("backward kernels", "gfx942"),
    }
    for unit in report.units:
        assert unit.unit.startswith(("build/fmha_fwd_appendkv_d32_fp16_", "build/fmha_bwd_convert_dq_d32_fp16_"))
        assert unit.status == "compiled" and unit.code_objects == ("gfx942",), unit
        assert "-mllvm -amdgpu-early-inline-all=true" in unit.command
    groups = {g.name: g.units for g in report.groups}
    assert groups["forward kernels"] > 1000 and groups["backward kernels"] > 1000, groups
    assert report.projection is not None and report.projection.lower_bound  # the cheapest units were sampled
    assert report.cache is not None
    assert report.cache.hit_rate == 1.0, report.cache.note
    # Jobs sized by the measured peak within the container's limit.
    sizing = report.sizing
    assert sizing is not None and sizing.capacity.memory_bytes <= 700 << 20
    assert sizing.jobs == 1 and f"--memory {LIMIT}" in sizing.capacity.where
    assert sizing.capacity.cores == 1 or f"1 job, not {sizing.capacity.cores}" in sizing.note, sizing
    profile = read_profile(layout.wheelhouse, "debian-sid")
    assert profile is not None and profile.recipes["flash-attention"].targets == ("gfx942",)
