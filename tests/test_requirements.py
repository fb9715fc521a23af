"""Requires-Dist pinned to the exact builds an extension links against (pipeline/repair/pins.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import RocwheelsError
from pipeline.repair.pins import exact_requirements, missing_pins, pin_requirements

FLASH_ATTN = """Metadata-Version: 2.1
Name: flash_attn
Version: 2.8.3.post2+rocm7.2
Requires-Python: >=3.9
Requires-Dist: torch
Requires-Dist: einops
Requires-Dist: Torch>=2.2; extra == "dev"

# FlashAttention
Requires-Dist: torch (this line is description text, not a field)
"""


def test_unpinned_requirement_gets_the_exact_build_and_the_rest_stays():
    pinned = pin_requirements(FLASH_ATTN, ["torch==2.14.1+rocm7.2"])
    header, body = pinned.split("\n\n", 1)
    assert header.splitlines() == [
        "Metadata-Version: 2.1",
        "Name: flash_attn",
        "Version: 2.8.3.post2+rocm7.2",
        "Requires-Python: >=3.9",
        "Requires-Dist: torch==2.14.1+rocm7.2",
        "Requires-Dist: einops",
        'Requires-Dist: Torch==2.14.1+rocm7.2; extra == "dev"',
    ]
    assert body == FLASH_ATTN.split("\n\n", 1)[1]
    assert exact_requirements(pinned) == {"torch": "2.14.1+rocm7.2"}


def test_a_range_is_replaced_by_the_pin():
    metadata = "Name: torchvision\nVersion: 0.29.1+rocm7.2\nRequires-Dist: numpy\nRequires-Dist: torch (==2.14.1)\n"
    pinned = pin_requirements(metadata, ["torch==2.14.1+rocm7.2"])
    assert (
        pinned
        == "Name: torchvision\nVersion: 0.29.1+rocm7.2\nRequires-Dist: numpy\nRequires-Dist: torch==2.14.1+rocm7.2\n"
    )


def test_a_linked_package_the_metadata_omits_is_added_after_the_other_requirements():
    metadata = "Name: vllm\nVersion: 0.34.0+rocm72\nRequires-Dist: numpy\nSummary: x\n"
    pinned = pin_requirements(metadata, ["torch==2.14.1+rocm7.2", "triton==3.8.0+rocm7.2"])
    assert pinned.splitlines() == [
        "Name: vllm",
        "Version: 0.34.0+rocm72",
        "Requires-Dist: numpy",
        "Requires-Dist: torch==2.14.1+rocm7.2",
        "Requires-Dist: triton==3.8.0+rocm7.2",
        "Summary: x",
    ]


def test_a_conditional_requirement_alone_does_not_count_as_the_pin():
    metadata = 'Name: x\nVersion: 1\nRequires-Dist: torch; python_version >= "3.9"\n'
    assert exact_requirements(pin_requirements(metadata, ["torch==2.13.0+cpu"])) == {"torch": "2.13.0+cpu"}


def test_no_pins_changes_nothing():
    assert pin_requirements(FLASH_ATTN, []) == FLASH_ATTN


def test_pinning_twice_gives_the_same_text():
    once = pin_requirements(FLASH_ATTN, ["torch==2.14.1+rocm7.2"])
    assert pin_requirements(once, ["torch==2.14.1+rocm7.2"]) == once


def test_an_invalid_requirement_is_a_clear_error():
    with pytest.raises(RocwheelsError, match="invalid Requires-Dist: 'torch >>= 2'"):
        pin_requirements("Name: x\nRequires-Dist: torch >>= 2\n", ["torch==2.13.0+cpu"])


def test_missing_pins_names_what_the_metadata_lacks():
    metadata = "Name: x\nVersion: 1\nRequires-Dist: torch==2.13.0\nRequires-Dist: triton==3.8.0+rocm7.2\n"
    assert missing_pins(metadata, ["torch==2.13.0+cpu", "triton==3.8.0+rocm7.2"]) == ["torch==2.13.0+cpu"]


def test_a_pin_must_be_exact():
    with pytest.raises(RocwheelsError, match="'torch>=2' is not an exact pin"):
        pin_requirements("Name: x\n", ["torch>=2"])


def test_verify_fails_a_line_wheel_without_its_exact_pins(tmp_path, make_wheel):
    """``rocwheels verify`` knows the builds a wheel of the test line must require (tests/torch-recipes)."""
    from click.testing import CliRunner

    from pipeline.cli import cli

    recipes = Path(__file__).parent / "torch-recipes"
    loose = make_wheel(tmp_path / "loose", "torch-ext", "0.1.0+rocm5.2", requires=("torch",))
    pinned = make_wheel(tmp_path / "pinned", "torch-ext", "0.1.0+rocm5.2", requires=("torch==2.13.0+cpu",))
    runner = CliRunner()
    verify = ["--recipes-dir", str(recipes), "--work-dir", str(tmp_path / "build"), "verify", "--no-smoke"]
    failed = runner.invoke(cli, [*verify, str(loose)])
    assert failed.exit_code == 1 and "Requires-Dist does not pin torch==2.13.0+cpu" in failed.output
    passed = runner.invoke(cli, [*verify, str(pinned)])
    assert passed.exit_code == 0, passed.output
