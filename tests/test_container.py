"""The container driver: its cibuildwheel configuration as cibuildwheel itself reads it (fast),
then the real canary recipe built, repaired, smoke-tested, verified and accepted through the
builder image on the debootstrapped Debian 13 base (podman; fails, never skips, without it).

The container test costs ~30 s when the base and builder images exist (about 20 s of that is
podman stopping cibuildwheel's container on this kind of host); the first run also makes the
base (~90 s) and the builder (~20 s; again after any change under pipeline/ or docker/).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from pipeline.build.container import (
    CCACHE_HIPCC,
    STATS_BEGIN,
    STATS_END,
    _one_per_python,
    before_build_script,
    builder_image,
    ccache_note,
    cibuildwheel_env,
    container_driver,
    smoke_script,
)
from pipeline.build.engine import Engine
from pipeline.build.local import BuiltWheel
from pipeline.config.layout import Layout
from pipeline.config.lock import load_lock
from pipeline.description import BuildDescription
from pipeline.errors import RocwheelsError
from pipeline.repair.repair import RepairSettings
from pipeline.util.cmd import run
from pipeline.wheel.analyze import Kind, analyze_wheel
from pipeline.wheel.archive import parse_wheel_name
from pipeline.wheels import make_wheels
from tests.helpers import REPO
from tests.helpers.containers import cibuildwheel_reads
from tests.helpers.recipes import DEBIAN13_TARGETS as ARCH
from tests.helpers.recipes import debian13_plan, line_plan, recipes_plan
from tests.helpers.wheels import the_build

RECIPES = REPO / "recipes"
# Where an engine must never be called: a test fails if one of these commands is run.
NO_ENGINE = Engine("podman", ("/nonexistent/podman",))


# Debian sid's clang 21 takes gfx950 and compresses (the lock's debian-sid line sets it).
SID_ARCH = ("gfx942", "gfx950")


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(RECIPES, tmp_path / "wheelhouse", tmp_path / "work")


def test_an_unpinned_registry_image_is_refused_before_anything_runs(layout: Layout) -> None:
    lock = load_lock(RECIPES)
    line = lock.line("rocm6.2")
    assert not line.pinned, "the rocm6.2 line was pinned: pick another unpinned example"
    plan = recipes_plan(RECIPES, ["rocm-canary"], ("rocm6.2", line), "gfx942", driver="container")
    with pytest.raises(RocwheelsError) as error:
        container_driver(plan, layout, engine=NO_ENGINE)
    assert "not pinned by digest" in error.value.message and line.builder_image in error.value.message
    assert error.value.fix is not None and error.value.fix.startswith("rocwheels lock pin --rocm rocm6.2")
    assert "ROCM=debian13" in error.value.fix and "DRIVER=local" in error.value.fix, "the offline routes"


def test_local_images_count_as_pinned_and_nothing_starts_before_a_build(layout: Layout) -> None:
    driver = container_driver(debian13_plan(layout), layout, engine=NO_ENGINE)
    assert callable(driver)
    assert not layout.work_dir.exists() and not layout.wheelhouse.exists()


def test_cibuildwheel_reads_the_settings_as_meant(layout: Layout, tmp_path: Path) -> None:
    plan = debian13_plan(layout)
    step = plan.steps[0]
    # Text that cibuildwheel's bash-like CIBW_ENVIRONMENT parser rejects or mangles even in quotes.
    tricky = "a 'b' \"c\" $HOME `date` <(x) ${(y"
    step = dataclasses.replace(step, env={**step.env, "TRICKY": tricky, "HIPCC": "/opt/my/hipcc"})
    settings = cibuildwheel_env(
        plan, step, engine=NO_ENGINE, image="localhost/rocwheels-builder:x", ccache=tmp_path / "cc dir", gpu=False
    )
    options, build = cibuildwheel_reads(settings, tmp_path)

    environment = build.environment.as_dictionary({"HOME": "/root", "PATH": "/usr/bin"})
    for key, value in step.env.items():
        assert environment[key] == value, key
    assert environment["HIPCC"] == "/opt/my/hipcc", "a recipe's value wins over rocwheels' default"
    assert environment["CCACHE_DIR"] == "/ccache" and environment["HIP_PLATFORM"] == "amd"
    assert {environment[f"CMAKE_{lang}_COMPILER_LAUNCHER"] for lang in ("C", "CXX", "HIP")} == {"ccache"}
    assert "PIP_FIND_LINKS" not in environment, "the canary has no dependencies"

    assert options.globals.build_selector.build_config == "cp313-manylinux_x86_64"
    assert build.manylinux_images["x86_64"] == "localhost/rocwheels-builder:x"
    assert build.container_engine.name == "podman"
    assert build.container_engine.create_args == (f"--volume={tmp_path / 'cc dir'}:/ccache",)
    # Its build requirements come from the line's hash-checked build lock, not an isolated env.
    assert (build.build_frontend.name, list(build.build_frontend.args)) == ("build", ["--no-isolation"])
    assert build.before_build == "bash {project}/.rocwheels/before-build.sh {package}"
    assert build.test_command == "bash {project}/.rocwheels/smoke.sh"
    # The repair in the image reads the step's own description, staged beside the scripts.
    assert build.repair_command.endswith(
        "cd / && rocwheels repair {wheel} -w {dest_dir} --settings {project}/.rocwheels/build-description.json"
    )


def test_torchvision_settings_pass_isolation_repair_policy_and_dependencies(layout: Layout, tmp_path: Path) -> None:
    """A recipe with depends_on, --no-isolation, link_packages and a platform tag (ROCm 6.2 line)."""
    plan = recipes_plan(RECIPES, ["torchvision"], "rocm6.2", "gfx90a;gfx942", driver="container")
    step = plan.steps[-1]
    settings = cibuildwheel_env(
        plan, step, engine=Engine("docker", ("docker",)), image="img", ccache=tmp_path, gpu=True
    )
    options, build = cibuildwheel_reads(settings, tmp_path, "cp311-manylinux_x86_64")

    assert (
        options.globals.build_selector.build_config
        == "cp310-manylinux_x86_64 cp311-manylinux_x86_64 cp312-manylinux_x86_64"
    )
    assert list(build.build_frontend.args) == ["--no-isolation"]
    assert build.container_engine.name == "docker"
    assert (
        "--device=/dev/kfd" in build.container_engine.create_args
        and "--device=/dev/dri" in build.container_engine.create_args
    )
    environment = build.environment.as_dictionary({})
    assert environment["PIP_FIND_LINKS"] == "/project/.rocwheels/deps"
    assert environment["PYTORCH_ROCM_ARCH"] == "gfx90a;gfx942"
    # What the repair in the image reads is the description's own settings: platform, linked
    # package, ROCm folder and the pin on the torch it links against.
    staged = step.write(tmp_path / "build-description.json")
    settings_read = RepairSettings.read(staged)
    assert settings_read == step.repair
    assert settings_read.plat == "manylinux_2_28_x86_64" and settings_read.rocm_lib_dir == "/opt/rocm/lib"
    assert settings_read.link_packages == ("torch/lib:libtorch*.so*,libc10*.so*,libshm.so*,libtorch_python.so*",)
    assert settings_read.requires_pins == ("torch==2.5.1+rocm6.2",) == step.expect.pins

    script = before_build_script(step)
    installs = shlex.join([*step.recipe.build.requires, "torch==2.5.1+rocm6.2"])
    assert f"python -m pip install --disable-pip-version-check {installs}" in script
    assert script.index("ccache -z") < script.index("pip install") < script.index('cd "$1"')


def test_scripts_are_valid_bash(layout: Layout, tmp_path: Path) -> None:
    plan = debian13_plan(layout)
    pre = ('echo "it\'s $PWD" > out', "test -f setup.py")
    step = dataclasses.replace(plan.steps[0], pre=pre)
    script = tmp_path / "before-build.sh"
    script.write_text(before_build_script(step))
    run(["bash", "-n", script])
    lines = script.read_text().splitlines()
    assert f'ln -sf "$ccache_bin" {CCACHE_HIPCC}' in lines
    # Each pre-build command runs as written, in its own bash, after changing to the package folder.
    commands = [shlex.split(line) for line in lines[lines.index('cd "$1"') + 1 :]]
    assert commands == [["bash", "-euo", "pipefail", "-c", command] for command in pre]

    smoke = step.recipe.smoke
    without_gpu, with_gpu = smoke_script(smoke, gpu=False), smoke_script(smoke, gpu=True)
    assert "import rocm_canary" in without_gpu and "run_kernel" not in without_gpu
    assert "run_kernel(256)" in with_gpu
    (tmp_path / "smoke.sh").write_text(with_gpu)
    run(["bash", "-n", tmp_path / "smoke.sh"])


CCACHE4 = f"""noise
{STATS_BEGIN}
cache_miss\t1
called_for_link\t2
direct_cache_hit\t2
preprocessed_cache_hit\t1
{STATS_END}
"""
# ccache 3.7 (EPEL 8): no --print-stats, the `ccache -s` table instead.
CCACHE3 = f"""{STATS_BEGIN}
cache directory                     /ccache
cache hit (direct)                     4
cache hit (preprocessed)               0
cache miss                             4
cache hit rate                     50.00 %
called for link                        1
{STATS_END}
"""


@pytest.mark.parametrize(
    ("log", "note"),
    [
        (CCACHE4, "ccache: 75% hits (3 of 4 compilations)"),
        (CCACHE3, "ccache: 50% hits (4 of 8 compilations)"),
        (CCACHE4 + CCACHE3, "ccache: 58% hits (7 of 12 compilations)"),  # one block per Python
        (
            f"{STATS_BEGIN}\ncalled_for_link\t1\ncache_miss\t0\n{STATS_END}\n",
            "ccache: nothing cacheable (1 compile-and-link calls)",
        ),
        (f"{STATS_BEGIN}\ncache_miss\t0\n{STATS_END}\n", "ccache: no compiler call went through ccache"),
        ("+ sh -c \"echo 'rocwheels: ccache statistics'; ...\"\n", "ccache: no statistics in the log"),
    ],
)
def test_ccache_note(log: str, note: str) -> None:
    assert ccache_note(log) == note


def wheel_file(folder: Path, python: str) -> Path:
    path = folder / f"rocm_canary-0.1.0+rocm6.2-{python}-{python}-manylinux_2_28_x86_64.whl"
    path.write_bytes(b"")
    return path


def test_one_wheel_per_python_in_the_lines_order(layout: Layout, tmp_path: Path) -> None:
    plan = debian13_plan(layout, python=("3.12", "3.13"))
    cp313, cp312 = wheel_file(tmp_path, "cp313"), wheel_file(tmp_path, "cp312")
    assert _one_per_python(plan.steps[0], plan, tmp_path, tmp_path / "log") == [cp312, cp313]
    cp313.unlink()
    with pytest.raises(
        RocwheelsError,
        match=r"expected one wheel for each of cp312, cp313 in .*found: rocm_canary-0\.1\.0\+rocm6\.2-cp312",
    ):
        _one_per_python(plan.steps[0], plan, tmp_path, tmp_path / "log")


@pytest.mark.container
def test_the_canary_builds_in_the_builder_image(
    podman_engine: Engine, trixie_base: str, layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "ccache"
    monkeypatch.setenv("ROCWHEELS_CCACHE_DIR", str(cache))
    # The lock's debian13 line with the test base under it (same debootstrap recipe, see
    # recipes/lock.toml: `rocwheels image base --suite trixie` makes localhost/rocwheels-base:trixie).
    plan = debian13_plan(layout, builder_image=trixie_base)
    driver = container_driver(plan, layout, engine=podman_engine)
    built: list[BuiltWheel] = []

    def recording(step: BuildDescription, layout: Layout, on_output) -> BuiltWheel:
        built.append(driver(step, layout, on_output))
        return built[-1]

    (outcome,) = make_wheels(plan, layout, recording)
    log = layout.log_file("rocm-canary").read_text()
    assert outcome.status == "built", f"{outcome.detail}\n{log[-3000:]}"

    wheel = the_build(outcome.wheels)
    assert wheel is not None and wheel.parent == layout.wheelhouse
    _, version, _, tags = parse_wheel_name(wheel.name)
    assert str(version) == "0.1.0+rocm5.7"
    assert {tag.interpreter for tag in tags} == {"cp313"}
    assert all(re.fullmatch(r"manylinux_\d+_\d+_x86_64", tag.platform) for tag in tags), wheel.name
    (extension,) = [m for m in analyze_wheel(wheel).members if m.gpu_targets]
    assert sorted(extension.gpu_targets) == sorted(ARCH)

    # Repaired in the container (the host only verified), smoke-tested there in a fresh venv.
    (result,) = built
    assert result.repaired
    assert "cd / && rocwheels repair /tmp/cibuildwheel/built_wheel/" in log
    # devices: 0 here; on a host whose GPU is a target, the container is given it.
    assert re.search(r"targets \('gfx942', 'gfx90a'\) devices \d+", log), log[-3000:]

    # hipcc ran through ccache into the host folder; a second build of the same source hits it.
    assert STATS_BEGIN in log and STATS_END in log
    assert result.note == "ccache: 0% hits (0 of 1 compilations)", result.note
    (again,) = make_wheels(plan, layout, recording, force=True)
    assert again.status == "built" and again.detail == "ccache: 100% hits (1 of 1 compilations)", again.detail


@pytest.mark.container
def test_the_canary_builds_with_compressed_bundles_on_debian_sid(
    podman_engine: Engine, sid_base: str, layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROCWHEELS_CCACHE_DIR", str(tmp_path / "ccache"))
    plan = line_plan(layout, "debian-sid", SID_ARCH, builder_image=sid_base)
    (outcome,) = make_wheels(plan, layout, container_driver(plan, layout, engine=podman_engine))
    log = layout.log_file("rocm-canary").read_text()
    assert outcome.status == "built", f"{outcome.detail}\n{log[-3000:]}"

    wheel = the_build(outcome.wheels)
    _, version, _, tags = parse_wheel_name(wheel.name)
    assert str(version) == "0.1.0+rocm6.4" and {tag.interpreter for tag in tags} == {"cp314"}
    (extension,) = [m for m in analyze_wheel(wheel).members if m.gpu_targets]
    assert sorted(extension.gpu_targets) == sorted(SID_ARCH)
    assert extension.bundles >= 1 and "none" not in extension.compression, extension.compression
    # sid's HIP runtime (libamdhip64.so.6 when this line was written) is ROCm's: excluded, not grafted.
    (runtime,) = [d for d in extension.dependencies if d.soname.startswith("libamdhip64.so")]
    assert runtime.kind == Kind.ROCM, runtime
    assert "--offload-compress" in log


def test_a_missing_local_base_image_is_explained_not_pulled(layout: Layout, tmp_path: Path) -> None:
    engine_script = tmp_path / "podman"
    engine_script.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\nexit 1\n')  # stores no image at all
    engine_script.chmod(0o755)
    line = load_lock(RECIPES).line("debian13").model_copy(update={"builder_image": "localhost/rocwheels-base:not-made"})
    with pytest.raises(RocwheelsError) as error:
        builder_image("debian13", line, Engine("podman", (str(engine_script),)), recipes_dir=RECIPES)
    assert "localhost/rocwheels-base:not-made is not in podman's image storage" in error.value.message
    assert "rocwheels image base --suite" in (error.value.fix or "")
    assert " build " not in f" {(tmp_path / 'calls').read_text()} ", "no image build was started"
