"""The local build driver, for real: the canary built with this host's hipcc."""

import zipfile

import pytest

from pipeline.build.local import build_local
from pipeline.config.layout import Layout
from pipeline.errors import CommandError
from pipeline.wheel.elf import read_elf
from pipeline.wheel.offload import gpu_targets, parse_fatbin
from tests.helpers import REPO
from tests.helpers.recipes import canary_plan

pytestmark = pytest.mark.hipcc


@pytest.fixture(scope="session")
def built_canary(tmp_path_factory: pytest.TempPathFactory, host_line, canary_targets):
    root = tmp_path_factory.mktemp("canary-build")
    layout = Layout(REPO / "recipes", root / "wheelhouse", root / "work")
    (step,) = canary_plan(layout, host_line, canary_targets).steps
    return layout, build_local(step, layout)


def test_canary_wheel_links_hip_and_carries_exactly_the_targets(built_canary, canary_targets, host_line, tmp_path):
    layout, built = built_canary
    assert built.path.parent == layout.raw("rocm-canary")
    assert f"+{host_line[1].local_version}-" in built.path.name
    with zipfile.ZipFile(built.path) as wheel:
        (extension,) = [n for n in wheel.namelist() if n.endswith(".so")]
        wheel.extract(extension, tmp_path)
    info = read_elf(tmp_path / extension)
    assert any(lib.startswith("libamdhip64.so") for lib in info.needed), info.needed
    assert info.hip_fatbin is not None
    assert gpu_targets(parse_fatbin(info.hip_fatbin)) == tuple(sorted(canary_targets))


def test_raw_wheel_stays_out_of_the_wheelhouse(built_canary):
    layout, _ = built_canary
    assert not list(layout.wheelhouse.glob("*.whl"))
    log = layout.log_file("rocm-canary").read_text()
    assert "+ " in log and "hipcc" in log and "--offload-arch=" in log


def test_failed_build_names_the_log_and_leaves_no_wheel(tmp_path, host_line, canary_targets):
    recipes = tmp_path / "recipes"
    (recipes / "rocm-canary").mkdir(parents=True)
    (recipes / "rocm-canary" / "setup.py").write_text("raise SystemExit('deliberately broken')\n")
    (recipes / "rocm-canary.toml").write_text((REPO / "recipes" / "rocm-canary.toml").read_text())
    (recipes / "lock.toml").write_text((REPO / "recipes" / "lock.toml").read_text())
    layout = Layout(recipes, tmp_path / "wheelhouse", tmp_path / "work")
    (step,) = canary_plan(layout, host_line, canary_targets).steps
    with pytest.raises(CommandError) as caught:
        build_local(step, layout)
    assert str(layout.log_file("rocm-canary")) in str(caught.value)
    assert "deliberately broken" in str(caught.value)
    assert not list(tmp_path.rglob("*.whl"))
