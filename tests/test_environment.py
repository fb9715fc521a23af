"""The build environment's installs (pipeline/build/environment.py): one order for a build and its
preflight, on every recipe of the shipped lock."""

from __future__ import annotations

from pathlib import Path

from pipeline.build.environment import installs_for
from pipeline.config.lock import load_lock
from pipeline.config.recipes import load_recipes
from pipeline.description import resolve

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def test_constraints_first_then_build_wheels_rocm_and_one_install_of_the_rest() -> None:
    recipes, lock = load_recipes(RECIPES), load_lock(RECIPES)
    seen_rocm_wheels = False
    for line_name, line in lock.lock.lines.items():
        for name in line.versions:
            step = resolve(recipes, name, line_name=line_name, line=line, targets=None, recipes_dir=RECIPES)
            installs = installs_for(
                step,
                constraints="constraints.txt",
                build_wheels=["torch.whl"],
                find_links=["wheelhouse"],
                dependencies=[("torch", "2.9.1+rocm7.2")],
                tools=["build"],
            )
            assert installs[0] == ["--require-hashes", "--no-deps", "-r", "constraints.txt"]
            assert installs[1] == ["--no-compile", "torch.whl"]
            if step.rocm_wheels:
                seen_rocm_wheels = True
                assert installs[2] == ["--extra-index-url", step.rocm_wheels.index_url, *step.rocm_wheels.build]
            assert installs[-1] == [
                "--find-links",
                "wheelhouse",
                "build",
                *step.recipe.build.requires,
                "torch==2.9.1+rocm7.2",
            ]
    assert seen_rocm_wheels  # a `wheels` line (ROCm from pip packages) is among them


def test_nothing_asked_nothing_installed() -> None:
    recipes, lock = load_recipes(RECIPES), load_lock(RECIPES)
    line_name, line = next(
        (n, line) for n, line in lock.lock.lines.items() if "rocm-canary" in line.versions and not line.rocm_wheels
    )
    step = resolve(recipes, "rocm-canary", line_name=line_name, line=line, targets=None, recipes_dir=RECIPES)
    installs = installs_for(step, constraints=None, build_wheels=[], find_links=[], dependencies=[])
    assert installs == ([[*step.recipe.build.requires]] if step.recipe.build.requires else [])
