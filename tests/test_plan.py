"""Plans: dependency order, cycles, target checks and resolved environments."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from pipeline.config.lock import load_lock
from pipeline.config.recipes import load_recipes
from pipeline.errors import ConfigError, RocwheelsError
from pipeline.plan import build_order, describe
from tests.helpers import ROCWHEELS
from tests.helpers.recipes import lock_toml, recipe_toml, recipes_plan

REPO = Path(__file__).resolve().parents[1]


ENV = {"USE_ROCM": "1", "BUILD_VERSION": "{version}+{local_version}"}


def recipe(name: str, depends_on: tuple[str, ...] = (), supported: tuple[str, ...] = ("gfx90a", "gfx942")) -> str:
    return recipe_toml(name, depends_on=depends_on, supported=supported, env=ENV)


def make_dir(tmp_path: Path, recipes: dict[str, str]) -> Path:
    for name, text in recipes.items():
        (tmp_path / f"{name}.toml").write_text(text)
    (tmp_path / "lock.toml").write_text(
        lock_toml(dict.fromkeys(recipes, "1.0"), targets=("gfx90a", "gfx942", "gfx1100"))
    )
    return tmp_path


def plan_for(folder: Path, wanted, arch="gfx90a;gfx942"):
    return recipes_plan(folder, wanted, "l", arch, jobs=3)


def test_dependencies_come_first(tmp_path):
    folder = make_dir(
        tmp_path,
        {"torch": recipe("torch"), "vision": recipe("vision", ("torch",)), "vllm": recipe("vllm", ("torch", "vision"))},
    )
    order = [r.name for r in build_order(load_recipes(folder), ["vllm"])]
    assert order == ["torch", "vision", "vllm"]


def test_cycle_is_named(tmp_path):
    folder = make_dir(tmp_path, {"a": recipe("a", ("b",)), "b": recipe("b", ("a",))})
    with pytest.raises(ConfigError) as caught:
        build_order(load_recipes(folder), ["a"])
    assert "a.toml: depends_on: dependency cycle: a -> b -> a" in str(caught.value)


def test_environment_is_resolved(tmp_path):
    folder = make_dir(tmp_path, {"torch": recipe("torch"), "vision": recipe("vision", ("torch",))})
    plan = plan_for(folder, ["vision"])
    torch, vision = plan.steps
    assert torch.env["PYTORCH_ROCM_ARCH"] == "gfx90a;gfx942"
    assert torch.env["BUILD_VERSION"] == "1.0+rocm6.2"
    assert torch.env["USE_ROCM"] == "1"
    assert vision.dependencies == (("torch", "1.0+rocm6.2"),)
    text = describe(plan)
    assert "1. torch 1.0+rocm6.2" in text and "2. vision" in text and "PYTORCH_ROCM_ARCH=gfx90a;gfx942" in text


def test_a_lines_env_reaches_every_step_over_the_recipes(tmp_path):
    folder = make_dir(tmp_path, {"torch": recipe("torch"), "vision": recipe("vision", ("torch",))})
    lock = (folder / "lock.toml").read_text()
    (folder / "lock.toml").write_text(
        lock.replace(
            '[lines."l".versions]',
            '[lines."l".env]\nUSE_ROCM = "2"\nEXTRA = "--offload-compress"\n[lines."l".versions]',
        )
    )
    for step in plan_for(folder, ["vision"]).steps:
        assert (step.env["USE_ROCM"], step.env["EXTRA"]) == ("2", "--offload-compress")
        assert step.env["PYTORCH_ROCM_ARCH"] == "gfx90a;gfx942", "the targets stay the recipe's"


def test_target_unsupported_by_recipe(tmp_path):
    folder = make_dir(tmp_path, {"fa": recipe("fa", supported=("gfx942",))})
    with pytest.raises(RocwheelsError) as caught:
        plan_for(folder, ["fa"], arch="gfx90a")
    assert "gfx90a not supported by recipe fa" in str(caught.value)
    assert "targets.supported" in str(caught.value) and "fa.toml" in str(caught.value)


def test_target_unsupported_by_line(tmp_path):
    folder = make_dir(tmp_path, {"fa": recipe("fa")})
    with pytest.raises(RocwheelsError, match=r"gfx950 not supported by ROCm line l .*lines.l.targets"):
        plan_for(folder, ["fa"], arch="gfx950")


def test_unknown_recipe(tmp_path):
    folder = make_dir(tmp_path, {"fa": recipe("fa")})
    with pytest.raises(RocwheelsError, match=r"unknown recipe.*: nope"):
        plan_for(folder, ["nope"])


def run_cli(*args):
    return subprocess.run([*ROCWHEELS, *args], cwd=REPO, capture_output=True, text=True)


def test_plan_cli_runs_nothing(tmp_path):
    result = run_cli(
        "--work-dir", tmp_path / "work", "plan", "--arch", "gfx90a", "--rocm", "debian12", "--recipes", "rocm-canary"
    )
    assert result.returncode == 0, result.stderr
    assert "ROCM_CANARY_OFFLOAD_FLAGS=--offload-arch=gfx90a" in result.stdout
    assert not (tmp_path / "work").exists()


def test_plan_cli_unknown_target():
    result = run_cli("plan", "--arch", "gfx9999", "--rocm", "debian12")
    assert result.returncode == 2  # bad input
    assert "unknown GPU target 'gfx9999'" in result.stderr and "gfx942" in result.stderr
    assert "Traceback" not in result.stderr


def test_label_aliases_of_the_shipped_lock():
    from pipeline.config.layout import Layout
    from pipeline.description import label_aliases

    # vllm 0.34.0 takes the line's label (VLLM_VERSION_OVERRIDE); 0.7.3 names its own.
    assert label_aliases(Layout(REPO / "recipes", REPO / "wheelhouse", REPO / "build")) == {"rocm624": "rocm6.2"}


def test_fallback_takes_over_for_targets_the_recipe_lacks(tmp_path):
    fallback = recipe("fa", supported=("gfx942",)).replace(
        "[smoke]",
        '[targets.fallback]\nsupported = ["gfx1100"]\nenv = { TRITON_BACKEND = "TRUE" }\ngpu_code = false\n[smoke]',
    )
    folder = make_dir(tmp_path, {"fa": fallback})
    (plain,) = plan_for(folder, ["fa"], arch="gfx942").steps
    assert "TRITON_BACKEND" not in plain.env and plain.recipe.gpu_code and not plain.recipe.smoke.env
    (rdna,) = plan_for(folder, ["fa"], arch="gfx942;gfx1100").steps
    assert rdna.env["TRITON_BACKEND"] == "TRUE" and not rdna.recipe.gpu_code
    assert rdna.recipe.smoke.env == {"TRITON_BACKEND": "TRUE"}
    assert all(
        snippet.startswith("import os; os.environ.update({'TRITON_BACKEND': 'TRUE'}); ")
        for snippet in rdna.recipe.smoke.snippets(gpu=False)
    )
    with pytest.raises(RocwheelsError, match=r"gfx90a not supported by recipe fa .* or its targets.fallback"):
        plan_for(folder, ["fa"], arch="gfx90a;gfx1100")


def test_shipped_flash_attention_picks_its_backend_by_target():
    def step(arch):
        result = run_cli("plan", "--json", "--rocm", "rocm7.2", "--arch", arch, "--recipes", "flash-attention")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["steps"][-1]

    assert "FLASH_ATTENTION_TRITON_AMD_ENABLE" not in step("gfx90a;gfx942")["environment"]
    rdna = step("gfx942;gfx1100")
    assert rdna["environment"]["FLASH_ATTENTION_TRITON_AMD_ENABLE"] == "TRUE" and rdna["gpu_code"] is False


EXPECTED_PLANS = REPO / "tests" / "expected-plans"


@pytest.mark.parametrize("line_name", list(load_lock(REPO / "recipes").lock.lines))
def test_expected_plan_of_every_line(line_name):
    """A change to any recipe or pin shows up as a reviewed diff of tests/expected-plans/.

    Regenerate with ROCWHEELS_UPDATE_PLANS=1 pytest tests/test_plan.py.
    """
    line = load_lock(REPO / "recipes").line(line_name)
    arch = "gfx942" if "gfx942" in line.targets else line.targets[0]
    result = run_cli("plan", "--json", "--driver", "container", "--jobs", "8", "--rocm", line_name, "--arch", arch)
    assert result.returncode == 0, result.stderr
    expected = EXPECTED_PLANS / f"{line_name}-{arch}.json"
    if os.environ.get("ROCWHEELS_UPDATE_PLANS"):
        expected.parent.mkdir(exist_ok=True)
        expected.write_text(result.stdout)
    assert expected.is_file(), f"no {expected}: run ROCWHEELS_UPDATE_PLANS=1 pytest {__file__}"
    assert json.loads(result.stdout) == json.loads(expected.read_text()), (
        f"the plan of {line_name} changed: review it, then regenerate {expected}"
    )
