import logging
import re
from pathlib import Path

import pytest

from pipeline.config.gpu_processors import gpu_processors, processor_table, warn_if_unverified
from pipeline.config.targets import GpuTarget, check_supported, format_targets, parse_targets, runs_on
from pipeline.errors import ConfigError, RocwheelsError
from pipeline.wheel.elf import amdgpu_processor

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


@pytest.mark.parametrize(
    "arch", ["gfx90a;gfx942", "gfx90a,gfx942", "gfx90a gfx942", " gfx90a ; gfx942 ;", "gfx90a,gfx942,gfx90a"]
)
def test_arch_spellings(arch):
    assert parse_targets(arch) == (GpuTarget("gfx90a"), GpuTarget("gfx942"))


def test_features_kept():
    (target,) = parse_targets("gfx90a:xnack+")
    assert target.processor == "gfx90a" and str(target) == "gfx90a:xnack+"


@pytest.mark.parametrize("arch", ["gfx9999", "sm_90", "gfx942:fast+", "", "gfx9-4", "gfx13-5-generic"])
def test_unknown_target_lists_valid_ones(arch):
    with pytest.raises(RocwheelsError) as caught:
        parse_targets(arch)
    assert "gfx942" in str(caught.value)


def test_unsupported_names_what_and_lists_choices():
    with pytest.raises(RocwheelsError) as caught:
        check_supported(parse_targets("gfx90a;gfx1100"), ("gfx90a", "gfx942"), what="recipe x")
    message = str(caught.value)
    assert "gfx1100 not supported by recipe x" in message and "gfx90a, gfx942" in message


def test_formats():
    targets = parse_targets("gfx90a;gfx942")
    assert format_targets(targets, separator=";") == "gfx90a;gfx942"
    assert (
        format_targets(targets, separator=" ", prefix="--offload-arch=")
        == "--offload-arch=gfx90a --offload-arch=gfx942"
    )


# Names real ROCm 7 wheels on PyPI carry, and LLVM's generic targets.
@pytest.mark.parametrize(
    "arch",
    [
        "gfx1033",
        "gfx1153",
        "gfx1250",
        "gfx125f",
        "gfx9-generic",
        "gfx9-4-generic",
        "gfx10-1-generic",
        "gfx10-3-generic",
        "gfx11-generic",
        "gfx12-generic",
        "gfx12-5-generic",
    ],
)
def test_every_llvm_target_is_known(arch):
    assert parse_targets(arch) == (GpuTarget(arch),)


@pytest.mark.parametrize("arch", ["gfx90a:xnack+", "gfx942:sramecc+", "gfx942:sramecc-:xnack+", "gfx11-generic:xnack-"])
def test_target_ids_with_features(arch):
    (target,) = parse_targets(arch)
    assert str(target) == arch and ":" not in target.processor


def test_generic_code_runs_on_the_processors_llvm_lists():
    assert runs_on("gfx11-generic", "gfx1100") and runs_on("gfx11-generic", "gfx1153")
    assert runs_on("gfx9-4-generic", "gfx942") and runs_on("gfx942", "gfx942")
    assert not runs_on("gfx11-generic", "gfx1200") and not runs_on("gfx942", "gfx90a")


# --- the processor table (pipeline/data/gfx-targets.toml) -------------------------------------


def test_every_elf_machine_value_maps_back_to_its_name():
    table = gpu_processors()
    for name, entry in table.by_name.items():
        assert table.by_mach[entry.mach].name == name
        assert amdgpu_processor(0xB00 | entry.mach) == name  # feature bits (xnack on, sramecc off) ignored


def test_generic_targets_serve_the_processors_naming_them():
    table = gpu_processors()
    assert table.by_name["gfx942"].generic == "gfx9-4-generic"
    assert table.by_name["gfx9-4-generic"].serves == ("gfx942",)
    assert table.describe("gfx9-4-generic") == "generic target for gfx942"
    for entry in table.by_name.values():
        assert all(table.by_name[p].generic == entry.name for p in entry.serves)


def test_table_covers_every_processor_of_the_recipes_and_the_lock():
    # Every quoted processor name: targets.supported, targets.fallback, per-release and lock line targets.
    named = {name for path in RECIPES.glob("*.toml") for name in re.findall(r'"(gfx[0-9a-z-]+)"', path.read_text())}
    assert {"gfx90a", "gfx942", "gfx1250"} <= named <= set(gpu_processors().by_name)


def test_an_unverified_processor_is_warned_about_once_when_used(caplog):
    unverified = next(name for name, entry in gpu_processors().by_name.items() if entry.unverified and entry.family)
    verified = next(name for name, entry in gpu_processors().by_name.items() if not entry.unverified and entry.family)
    warn_if_unverified.cache_clear()
    with caplog.at_level(logging.WARNING, logger="rocwheels"):
        parse_targets(verified)
        assert not caplog.records, "a verified processor warns of nothing"
        parse_targets(f"{unverified};{verified}")
        parse_targets(unverified)
    (record,) = caplog.records
    assert unverified in record.getMessage() and "unverified" in record.getMessage()


@pytest.mark.parametrize(
    "document, field",
    [
        ({"processors": {"gfx1": {"mach": 0x20}, "gfx2": {"mach": 0x20}}}, "gfx2"),
        ({"processors": {"gfx1": {"mach": 0x20, "generic": "gfx-generic"}}}, "processors.gfx1.generic"),
        ({"processors": {"gfx1": {"mach": "0x20"}}}, "processors.gfx1.mach"),
        ({"processors": {"gfx1": {"mach": 0x20}}, "generic": {"gfx1": {"mach": 0x51}}}, "gfx1"),
    ],
)
def test_a_broken_table_names_the_field(document, field):
    with pytest.raises(ConfigError) as caught:
        processor_table(document)
    assert caught.value.field == field and caught.value.file.endswith("gfx-targets.toml")
