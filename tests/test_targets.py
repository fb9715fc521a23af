import pytest

from pipeline.config.targets import GpuTarget, check_supported, format_targets, parse_targets, runs_on
from pipeline.errors import RocwheelsError


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
