"""Compiler cache hits on HIP code: real compiles twice through ccache and sccache, here and in Debian sid."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from pipeline.build.cache_pass import CachePass, CompileCommand, cache_pass
from pipeline.build.container import cibuildwheel_env
from pipeline.build.engine import Engine
from pipeline.config.layout import Layout
from pipeline.config.toolchain import HIP_ENV
from tests.helpers import REPO
from tests.helpers.containers import cibuildwheel_reads, python_in
from tests.helpers.hip import KERNEL
from tests.helpers.recipes import debian13_plan

# The flags flash-attention 2.8.3.post2's setup.py gives its CK units for HIP 6.4, its -mllvm pairs included.
FLASH_ATTENTION_FLAGS = shlex.split(
    "-fPIC -D__HIP_PLATFORM_AMD__=1 -DUSE_ROCM=1 -O3 -std=c++17 -fgpu-flush-denormals-to-zero "
    "-mllvm --lsr-drop-solution=1 -fno-offload-uniform-block -mllvm -enable-post-misched=0 "
    "-mllvm -amdgpu-early-inline-all=true -mllvm -amdgpu-function-calls=false"
)


@pytest.fixture(scope="session")
def ccache() -> str:
    path = shutil.which("ccache")
    if path is None:
        pytest.fail("ccache is not on PATH: apt-get install -y ccache (the builder images have it)")
    return path


def units(folder: Path, hipcc: str, target: str, count: int = 2) -> list[CompileCommand]:
    """``count`` HIP files in ``folder``, each with its compile command for ``target``."""
    commands = []
    for number in range(count):
        source = folder / f"unit{number}.hip"
        source.write_text(KERNEL.replace("add_one", f"add_{number}"))
        argv = (hipcc, "-x", "hip", "-c", f"--offload-arch={target}", source.name, "-o", f"unit{number}.o")
        commands.append(CompileCommand(source.name, argv, folder, HIP_ENV))
    return commands


def two_sources(folder: Path, hipcc: str, target: str) -> CompileCommand:
    """One call compiling two sources: a compile no cache can serve (one call, one result)."""
    (folder / "a.hip").write_text(KERNEL)
    (folder / "b.hip").write_text(KERNEL.replace("add_one", "add_two"))
    argv = (hipcc, "-x", "hip", "-c", f"--offload-arch={target}", "a.hip", "b.hip")
    return CompileCommand("a.hip+b.hip", argv, folder, HIP_ENV)


def test_hip_units_hit_ccache_on_the_second_pass(ccache, hipcc, hip_targets, tmp_path):
    (tmp_path / "src").mkdir()
    result = cache_pass(units(tmp_path / "src", hipcc, hip_targets[0]), tmp_path / "pass")
    assert result.tool.startswith("ccache ")
    assert (result.compiles, result.hits_second_pass, result.hit_rate, result.uncached) == (2, 2, 1.0, ())
    assert result.note() == f"{result.tool}: 100% hits on the second pass (2 of 2)"
    assert not list((tmp_path / "src").glob("*ccache*")), "nothing of ccache's left beside the objects"


def test_a_compile_ccache_cannot_serve_is_named_with_its_reason(ccache, hipcc, hip_targets, tmp_path):
    (tmp_path / "src").mkdir()
    commands = [
        *units(tmp_path / "src", hipcc, hip_targets[0], count=1),
        two_sources(tmp_path / "src", hipcc, hip_targets[0]),
    ]
    result = cache_pass(commands, tmp_path / "pass")
    assert (result.compiles, result.hits_second_pass, result.hit_rate) == (2, 1, 0.5)
    assert result.uncached == (("a.hip+b.hip", "Multiple input files: a.hip and b.hip (multiple_source_files)"),)
    assert result.note().endswith(
        "not served: a.hip+b.hip (Multiple input files: a.hip and b.hip (multiple_source_files))"
    )


def test_sccache_when_a_shared_cache_is_configured(hipcc, hip_targets, tmp_path, monkeypatch):
    # The setting chooses the tool; the pass itself uses a private local cache, never the team's.
    monkeypatch.setenv("ROCWHEELS_SCCACHE", "redis://127.0.0.1:9")
    (tmp_path / "src").mkdir()
    commands = [
        *units(tmp_path / "src", hipcc, hip_targets[0], count=1),
        two_sources(tmp_path / "src", hipcc, hip_targets[0]),
    ]
    result = cache_pass(commands, tmp_path / "pass", line_name="l")
    assert result.tool.startswith("sccache ")
    assert (result.hits_second_pass, result.uncached) == (1, (("a.hip+b.hip", "not cacheable: multiple input files"),))


def test_flash_attention_flags_hit_ccache_with_sid_hipcc(podman_engine, sid_base, tmp_path):
    """Debian sid's hipcc 7 (clang 21) with flash-attention's flags for gfx942, through the image's ccache."""
    (tmp_path / "k.hip").write_text(KERNEL)
    argv = ["hipcc", "-x", "hip", "-c", "--offload-arch=gfx942", *FLASH_ATTENTION_FLAGS, "k.hip", "-o", "k.o"]
    code = (
        "import json, pathlib; from dataclasses import asdict; "
        "from pipeline.build.cache_pass import CompileCommand, cache_pass; "
        f"r = cache_pass([CompileCommand('k.hip', tuple({argv!r}), pathlib.Path('/work'))], pathlib.Path('/tmp/pass')); "
        "print(json.dumps(asdict(r)))"
    )
    output = python_in(podman_engine, sid_base, code, work=tmp_path)
    result = CachePass(**json.loads(output.splitlines()[-1]))
    assert result.tool.startswith("ccache 4.")
    assert (result.compiles, result.hits_second_pass) == (1, 1) and not result.uncached


def test_container_builds_check_the_clang_behind_hipcc(tmp_path):
    """ccache's default check (hipcc's own mtime) would serve objects of an older clang behind the same hipcc."""
    layout = Layout(REPO / "recipes", tmp_path / "wheelhouse", tmp_path / "work")
    plan = debian13_plan(layout)
    engine = Engine("podman", ("/nonexistent/podman",))
    settings = cibuildwheel_env(plan, plan.steps[0], engine=engine, image="x", ccache=tmp_path, gpu=False)
    environment = cibuildwheel_reads(settings, tmp_path)[1].environment.as_dictionary({"PATH": "/usr/bin"})
    assert environment["CCACHE_COMPILERCHECK"] == "%compiler% --version"
