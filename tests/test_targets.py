import pytest

from pipeline.errors import RocwheelsError
from pipeline.targets import GpuTarget, check_supported, format_targets, parse_targets


@pytest.mark.parametrize("arch", ["gfx90a;gfx942", "gfx90a,gfx942", "gfx90a gfx942", " gfx90a ; gfx942 ;", "gfx90a,gfx942,gfx90a"])
def test_arch_spellings(arch):
    assert parse_targets(arch) == (GpuTarget("gfx90a"), GpuTarget("gfx942"))


def test_features_kept():
    (target,) = parse_targets("gfx90a:xnack+")
    assert target.processor == "gfx90a" and str(target) == "gfx90a:xnack+"


@pytest.mark.parametrize("arch", ["gfx9999", "sm_90", "gfx942:fast+", ""])
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
    assert format_targets(targets, separator=" ", prefix="--offload-arch=") == "--offload-arch=gfx90a --offload-arch=gfx942"
