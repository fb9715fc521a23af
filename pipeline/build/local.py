"""Build stage, local driver: run a recipe's steps on this host and keep the raw wheel aside.

Raw wheels go to the work folder, never to the wheelhouse: only repair and verify may put a
wheel there.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.build.compiler_cache import RemoteCache, SccacheServer, remote_cache
from pipeline.build.environment import installs_for, make_environment
from pipeline.build.sources import fetch_build_wheels, prepare_source
from pipeline.config.layout import Layout, fresh_dir
from pipeline.config.rocm_wheels import rocm_sdk_env
from pipeline.description import BuildDescription
from pipeline.errors import RocwheelsError
from pipeline.plan import Plan
from pipeline.util.cmd import run
from pipeline.util.log import RecipeLogger, recipe_logger
from pipeline.wheel.archive import parse_wheel_name, split_variant


@dataclass(frozen=True)
class BuiltWheel:
    recipe: str
    path: Path
    log_file: Path
    seconds: float
    repaired: bool = False  # the container driver repairs inside the builder image
    note: str = ""  # shown in the summary (e.g. the compiler cache hit rate)
    more: tuple[Path, ...] = ()  # the same build for the line's other Python versions

    @property
    def paths(self) -> tuple[Path, ...]:
        return (self.path, *self.more)


def build_local(
    step: BuildDescription,
    layout: Layout,
    *,
    on_output: Callable[[str], None] | None = None,
    cache: RemoteCache | None = None,
) -> BuiltWheel:
    """Build one recipe on this host: clean work folder, build venv, pre-build steps, pypa/build.

    With a remote ``cache``, every compilation goes through an sccache server of this build.
    """
    logger = recipe_logger(step.name)
    started = time.monotonic()
    log_file = start_log(step, layout, "on this host")
    work = fresh_dir(layout.recipe_work(step.name))
    source = prepare_source(step.recipe, layout.recipes_dir, work / "src", log_file=log_file, logger=logger)
    venv = _build_venv(step, layout, work / "venv", log_file, logger)
    env = {**step.env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    if step.rocm_wheels:
        env = {**env, **rocm_sdk_env(venv / "bin" / "rocm-sdk", env["PATH"], log_file=log_file)}

    server = SccacheServer(cache, work / "sccache", base_dir=layout.work_dir) if cache else None
    note = ""
    if server:
        env.update(server.start())
    try:
        for command in step.pre:
            run(
                ["bash", "-euo", "pipefail", "-c", command],
                cwd=source,
                env=env,
                log_file=log_file,
                logger=logger,
                on_output=on_output,
            )
        dist = work / "dist"
        run(
            [venv / "bin" / "python", "-m", "build", *step.build_args, "--outdir", dist, source],
            env=env,
            log_file=log_file,
            logger=logger,
            on_output=on_output,
        )
    finally:
        if server:
            note = server.stop()

    wheel = _the_wheel(step, dist, log_file)
    final = fresh_dir(layout.raw(step.name)) / wheel.name
    shutil.move(wheel, final)
    seconds = time.monotonic() - started
    logger.info("built %s in %.0f s%s", final.name, seconds, f" ({note})" if note else "")
    return BuiltWheel(step.name, final, log_file, seconds, note=note)


def local_driver_for(plan: Plan) -> Callable[[BuildDescription, Layout, Callable[[str], None]], BuiltWheel]:
    """The local build driver for ``plan``: through the shared compiler cache when one is configured."""
    cache = remote_cache(plan.line_name)
    if cache:
        recipe_logger("sccache").info("compiler cache: %s", cache.location)

    def drive(step: BuildDescription, layout: Layout, on_output: Callable[[str], None]) -> BuiltWheel:
        return build_local(step, layout, on_output=on_output, cache=cache)

    return drive


def start_log(step: BuildDescription, layout: Layout, where: str) -> Path:
    """Begin the recipe's log file afresh for this build, and say where it is."""
    log_file = layout.log_file(step.name)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    jobs = f"# compile jobs: {step.jobs_note}\n" if step.jobs_note else ""
    log_file.write_text(f"# rocwheels build of {step.name} {step.wheel_version} {where}\n{jobs}")
    recipe_logger(step.name).info("building %s %s (log: %s)", step.wheel_version, where, log_file)
    if step.jobs_note:
        recipe_logger(step.name).warning("compile jobs: %s", step.jobs_note)
    return log_file


def _build_venv(step: BuildDescription, layout: Layout, venv: Path, log_file: Path, logger: RecipeLogger) -> Path:
    """A fresh venv with pypa/build, the recipe's build requirements and its dependencies' wheels."""
    for name, version in step.dependencies:
        accepted_wheels(layout.wheelhouse, name, version)  # fail early and clearly if one is missing
    installs = installs_for(
        step,
        constraints=str(step.constraints) if step.constraints else None,
        build_wheels=[str(path) for path in fetch_build_wheels(step.recipe, layout.recipes_dir, logger)],
        # pip picks the dependency wheel matching this Python from the wheelhouse.
        find_links=[str(layout.wheelhouse)] if step.dependencies else [],
        dependencies=step.dependencies,
        tools=["build"],
    )
    return make_environment(sys.executable, venv, installs, log_file=log_file, logger=logger)


def find_wheels(folder: Path, dist_name: str, version: str, label: str | None = None) -> list[Path]:
    """The wheels of exactly ``dist_name==version`` in ``folder`` (one per Python version): the
    plain ones, or with ``label`` the variant wheels of that label."""
    found = []
    for wheel in sorted(folder.glob("*.whl")):
        name, wheel_version, _, _ = parse_wheel_name(wheel.name)
        same = name.replace("-", "_") == dist_name and str(wheel_version) == version
        if same and split_variant(wheel.name)[1] == label:
            found.append(wheel)
    return found


def accepted_wheels(wheelhouse: Path, dist_name: str, version: str) -> list[Path]:
    """The accepted wheels of a dependency (built earlier in the plan, or before)."""
    wheels = find_wheels(wheelhouse, dist_name, version)
    if not wheels:
        raise RocwheelsError(
            f"no wheel of {dist_name}=={version} in {wheelhouse}", fix="build that recipe first (it is in depends_on)"
        )
    return wheels


def _the_wheel(step: BuildDescription, dist: Path, log_file: Path) -> Path:
    wheels = sorted(dist.glob("*.whl"))
    if len(wheels) != 1:
        raise RocwheelsError(
            f"{step.name}: the build produced {len(wheels)} wheels in {dist}, expected one", fix=f"see {log_file}"
        )
    version = str(parse_wheel_name(wheels[0].name)[1])
    if version != step.wheel_version:
        raise RocwheelsError(
            f"{step.name}: built version {version}, the lock expects {step.wheel_version}",
            fix="the recipe's [env] must hand the version and +{local_version} label to the package's build (see recipes/README.md)",
        )
    return wheels[0]
