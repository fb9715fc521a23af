"""The ``rocwheels`` command line: parses options and calls one stage function each."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from pipeline.config import lock as lockmod
from pipeline.config.build_constraints import check_constraints, compile_constraints
from pipeline.config.layout import Layout
from pipeline.config.recipes import load_recipes
from pipeline.config.targets import parse_targets
from pipeline.errors import Interrupted, RocwheelsError
from pipeline.plan import Plan, describe, plan_document, select_plan
from pipeline.util.log import setup_logging
from pipeline.util.runlock import wheelhouse_lock

if TYPE_CHECKING:
    from pipeline.wheels import Driver

log = logging.getLogger("rocwheels")
# A click command function, before and after an option decorator.
Command = TypeVar("Command", bound=Callable[..., Any])
DRIVERS = ("local", "container")
# The kinds of path the commands take; click checks them before a command runs.
FOLDER = click.Path(path_type=Path, file_okay=False)
FILE = click.Path(path_type=Path, dir_okay=False)
EXISTING_FILE = click.Path(path_type=Path, dir_okay=False, exists=True)


@dataclass(frozen=True)
class Context:
    layout: Layout


def target_options(command: Command) -> Command:
    """The options that choose what to build: recipes, GPU targets, ROCm line, driver."""
    # No bare ARCH/ROCM/DRIVER environment variables: ARCH=x86_64 is common in build shells.
    command = click.option(
        "--driver",
        type=click.Choice(DRIVERS),
        default="container",
        envvar="ROCWHEELS_DRIVER",
        show_default=True,
        help="local: this host's ROCm; container: the lock line's builder image",
    )(command)
    command = click.option(
        "--rocm",
        "rocm",
        envvar="ROCWHEELS_ROCM",
        default=None,
        help="lock line (recipes/lock.toml [lines.NAME]); default: the host's ROCm (local) or default_line",
    )(command)
    command = click.option(
        "--arch", required=True, envvar="ROCWHEELS_ARCH", help="GPU targets: gfx942, 'gfx90a;gfx942' or gfx90a,gfx942"
    )(command)
    command = click.option(
        "--recipes",
        default=None,
        help="recipes to build, comma separated (default: all in the line); dependencies are added",
    )(command)
    command = click.option(
        "--jobs",
        type=click.IntRange(min=1),
        default=None,
        envvar="ROCWHEELS_JOBS",
        help="parallel compile jobs ({jobs} in recipes); default: the build host's cores, no more than its available "
        "memory carries at the peak per unit the line's build profile measured (8 GB without one)",
    )(command)
    return click.option(
        "--python",
        default=None,
        envvar="ROCWHEELS_PYTHON",
        help="build for this one of the line's Python versions (X.Y; one CI job each); default: all",
    )(command)


def engine_option(command: Command) -> Command:
    from pipeline.build.engine import ENGINES

    return click.option(
        "--engine",
        "engine_name",
        type=click.Choice(ENGINES),
        default=None,
        envvar="ROCWHEELS_ENGINE",
        help="container engine (default: podman if it works, else docker)",
    )(command)


def rocm_line_option(command: Command) -> Command:
    return click.option(
        "--rocm",
        envvar="ROCWHEELS_ROCM",
        default=None,
        help="lock line (recipes/lock.toml [lines.NAME]); default: default_line",
    )(command)


def timeout_option(command: Command) -> Command:
    from pipeline.util.net import DEFAULT_TIMEOUT, TIMEOUT_ENV

    return click.option(
        "--timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=DEFAULT_TIMEOUT,
        envvar=TIMEOUT_ENV,
        show_default=True,
        help="seconds any one network call to the index may wait for an answer",
    )(command)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--recipes-dir", type=FOLDER, default=Path("recipes"), show_default=True, envvar="ROCWHEELS_RECIPES")
@click.option("--wheelhouse", type=FOLDER, default=Path("wheelhouse"), show_default=True, envvar="ROCWHEELS_WHEELHOUSE")
@click.option(
    "--work-dir",
    type=FOLDER,
    default=Path("build"),
    show_default=True,
    envvar="ROCWHEELS_WORK_DIR",
    help="sources, build environments and raw wheels",
)
@click.option("-v", "--verbose", is_flag=True)
@click.pass_context
def cli(ctx: click.Context, recipes_dir: Path, wheelhouse: Path, work_dir: Path, verbose: bool) -> None:
    """Build, repair, verify and publish ROCm wheels from pinned recipes."""
    setup_logging(verbose)
    ctx.obj = Context(Layout(recipes_dir.resolve(), wheelhouse.resolve(), work_dir.resolve()))


@cli.group("lock")
def lock_group() -> None:
    """The version lock (recipes/lock.toml)."""


@lock_group.command("check")
@click.pass_obj
def lock_check(obj: Context) -> None:
    """Check the lock against the recipes and the compatibility rules."""
    recipes = load_recipes(obj.layout.recipes_dir)
    lock_file = lockmod.load_lock(obj.layout.recipes_dir)
    for warning in lockmod.check_lock(lock_file, recipes):
        click.echo(f"warning: {warning}", err=True)
    for line_name in lock_file.lock.lines:
        check_constraints(recipes, lock_file, line_name)
    lines = ", ".join(
        f"{name} (ROCm {line.rocm}: {len(line.versions)} recipes)" for name, line in lock_file.lock.lines.items()
    )
    click.echo(f"{lock_file.path}: consistent; lines: {lines}")


@lock_group.command("constraints")
@click.option("--rocm", "rocm", default=None, help="one line (default: every line)")
@click.pass_obj
def lock_constraints(obj: Context, rocm: str | None) -> None:
    """Resolve each line's build requirements with hashes into recipes/constraints/<line>.txt."""
    recipes = load_recipes(obj.layout.recipes_dir)
    lock_file = lockmod.load_lock(obj.layout.recipes_dir)
    lockmod.check_lock(lock_file, recipes)
    for line_name in [rocm] if rocm else list(lock_file.lock.lines):
        lock_file.line(line_name)  # an unknown name is an error before anything is resolved
        click.echo(f"{line_name}: {compile_constraints(recipes, lock_file, line_name)}")


@lock_group.command("pin")
@rocm_line_option
@click.option("--refresh", is_flag=True, help="pull the tag again even when the image is pinned already")
@engine_option
@click.pass_obj
def lock_pin(obj: Context, rocm: str | None, refresh: bool, engine_name: str | None) -> None:
    """Pull the line's registry builder image and write it into the lock by digest."""
    from pipeline.build.engine import detect_engine
    from pipeline.config.pin import pin_line

    result = pin_line(obj.layout.recipes_dir, rocm, lambda: detect_engine(engine_name), refresh=refresh)
    click.echo(f"lines.{result.line}: {result.status}: {result.image}")


@cli.command("plan")
@target_options
@click.pass_obj
@click.option("--json", "as_json", is_flag=True, help="the plan as JSON, for machines (CI)")
def plan_command(
    obj: Context,
    recipes: str | None,
    arch: str,
    rocm: str | None,
    driver: str,
    jobs: int | None,
    python: str | None,
    as_json: bool,
) -> None:
    """Print the ordered build steps with their environment and commands; runs nothing."""
    plan = select_plan(obj.layout, recipes, arch, rocm, driver, jobs, python)
    click.echo(json.dumps(plan_document(plan), indent=2) if as_json else describe(plan))


@cli.command("build")
@target_options
@click.pass_obj
def build_command(
    obj: Context, recipes: str | None, arch: str, rocm: str | None, driver: str, jobs: int | None, python: str | None
) -> None:
    """Build wheels into the work folder, not the wheelhouse (no verify: see `wheels`)."""
    plan = select_plan(obj.layout, recipes, arch, rocm, driver, jobs, python, building=True)
    build = driver_for(driver, plan, obj.layout)
    with _work_dir_lock(obj.layout):
        for step in plan.steps:
            built = build(step, obj.layout, lambda line: None)
            click.echo(f"{built.recipe}: {'repaired' if built.repaired else 'raw'} wheel {built.path}")


def _work_dir_lock(layout: Layout) -> contextlib.AbstractContextManager[object]:
    """One building run per work folder: the second waits (its build folders are emptied per recipe)."""
    if layout.work_dir == layout.wheelhouse:  # one folder, one lock (taken for the wheelhouse)
        return contextlib.nullcontext()
    return wheelhouse_lock(layout.work_dir, what="work folder", option="--work-dir or ROCWHEELS_WORK_DIR")


def _wheel_paths(wheels: tuple[Path, ...]) -> list[Path]:
    if not wheels:
        raise click.UsageError("give one or more wheel files")
    return [w.resolve() for w in wheels]


@cli.command("wheels")
@target_options
@click.option("--force", is_flag=True, help="rebuild recipes whose wheel is already in the wheelhouse")
@click.option(
    "--no-pin",
    is_flag=True,
    help="refuse a builder image the lock names by tag instead of pinning its digest on first use (always so in CI)",
)
@click.option(
    "--from-index",
    default=None,
    envvar="ROCWHEELS_REUSE_INDEX",
    help="PEP 503 simple URL holding wheels with signed provenance records, or the upload URL of a rocwheels serve index: take the exact builds from there",
)
@click.option(
    "--preflight",
    is_flag=True,
    help="build nothing: do what a build does up to its compilation, compile a sample of each recipe's units "
    "per target, and report their memory and time and the full build's projection",
)
@click.option(
    "--unit-time-limit",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="with --preflight: seconds one unit may compile before it is stopped (default: the recipe's, else 600)",
)
@timeout_option
@click.pass_obj
def wheels_command(
    obj: Context,
    recipes: str | None,
    arch: str,
    rocm: str | None,
    driver: str,
    jobs: int | None,
    python: str | None,
    force: bool,
    no_pin: bool,
    from_index: str | None,
    preflight: bool,
    unit_time_limit: float | None,
    timeout: float,
) -> None:
    """Build, repair and verify: only verified wheels reach the wheelhouse (--preflight: a trial that builds nothing)."""
    from pipeline.wheels import make_wheels, summary_table

    if unit_time_limit is not None and not preflight:
        raise click.UsageError("--unit-time-limit applies to --preflight only")

    plan = select_plan(obj.layout, recipes, arch, rocm, driver, jobs, python, building=True)
    # Trust on first use, where a person runs it: CI must build from what was reviewed and committed.
    if driver == "container" and not plan.line.pinned and not no_pin and not os.environ.get("CI"):
        from pipeline.build.container import pin_on_first_use
        from pipeline.build.engine import detect_engine

        if pin_on_first_use(plan.line_name, plan.line, obj.layout.recipes_dir, detect_engine):
            plan = select_plan(obj.layout, recipes, arch, rocm, driver, jobs, python, building=True)
    if preflight:
        _preflight(plan, obj.layout, driver, unit_time_limit)
        return
    with _work_dir_lock(obj.layout), wheelhouse_lock(obj.layout.wheelhouse):
        if from_index and not force:
            from pipeline.ci import fetch_from_index

            fetch_from_index(plan, obj.layout, from_index, timeout=timeout)
        outcomes = make_wheels(plan, obj.layout, driver_for(driver, plan, obj.layout), force=force)
    summary_table(outcomes)
    if any(o.status in ("failed", "skipped") for o in outcomes):
        raise RocwheelsError("some recipes failed; their logs are in " + str(obj.layout.logs))


def _preflight(plan: Plan, layout: Layout, driver: str, unit_time_limit: float | None) -> None:
    from pipeline.preflight.drivers import preflight_plan, report_path
    from pipeline.preflight.report import render

    with _work_dir_lock(layout):
        reports = preflight_plan(plan, layout, driver, unit_time_limit=unit_time_limit)
    render(reports)
    failed = [report.recipe for report in reports if not report.ok]
    if failed:
        raise RocwheelsError(
            f"preflight failed for {', '.join(failed)}",
            fix="see the table above; reports and logs: "
            + ", ".join(str(report_path(layout, name)) for name in failed)
            + " (and the .preflight.log beside each)",
        )


@cli.command("preflight-job", hidden=True)
@click.argument("job_file", type=EXISTING_FILE)
@click.option("--source", type=click.Path(path_type=Path, file_okay=False, exists=True), required=True)
@click.option("--report", type=FILE, required=True)
@click.option("--log", "log_file", type=FILE, required=True)
def preflight_job_command(job_file: Path, source: Path, report: Path, log_file: Path) -> None:
    """A recipe's preflight staged by `wheels --preflight` (run in the builder image): the report to REPORT."""
    from pipeline.preflight.drivers import run_job

    run_job(job_file, source, report, log_file)


@cli.command("repair")
@click.argument("wheels", nargs=-1, type=FILE)
@click.option(
    "-w",
    "--wheel-dir",
    type=FOLDER,
    default=None,
    help="output folder (default: repaired/ in the work folder; never the wheelhouse, which holds only verified wheels)",
)
@click.option(
    "--rocm",
    default=None,
    help="lock line whose ROCm library folder and platform apply (default: from the wheel's +rocm label)",
)
@click.option(
    "--rocm-lib-dir",
    default=None,
    help="ROCm library folder for the RPATH (default: the lock line's, else /opt/rocm/lib)",
)
@click.option(
    "--exclude",
    multiple=True,
    help="soname pattern never grafted, on top of the ROCm list and the recipe's (repeatable)",
)
@click.option(
    "--link-package",
    multiple=True,
    help="'<folder in site-packages>:<soname patterns>' (repeatable), e.g. torch/lib:libtorch*.so*",
)
@click.option("--rpath", multiple=True, help="extra RPATH entry to keep (repeatable)")
@click.option(
    "--plat", default=None, help="auditwheel platform policy, e.g. manylinux_2_28_x86_64 (default: the lock line's)"
)
@click.option(
    "--requires-pin",
    multiple=True,
    help="exact requirement METADATA must carry, e.g. 'torch==2.14.1+rocm7.2' (repeatable)",
)
@click.option(
    "--rocm-provider",
    type=click.Choice(["system", "wheels"]),
    default=None,
    help="wheels: ROCm from pip packages (TheRock), reached by $ORIGIN RPATHs (default: the lock line's)",
)
@click.option(
    "--settings",
    "settings_file",
    type=EXISTING_FILE,
    default=None,
    help="a build description (JSON, as rocwheels writes it for the container): its repair settings apply",
)
@click.pass_obj
def repair_command(
    obj: Context,
    wheels: tuple[Path, ...],
    wheel_dir: Path | None,
    rocm: str | None,
    rocm_lib_dir: str | None,
    exclude: tuple[str, ...],
    link_package: tuple[str, ...],
    rpath: tuple[str, ...],
    plat: str | None,
    requires_pin: tuple[str, ...],
    rocm_provider: str | None,
    settings_file: Path | None,
) -> None:
    """Repair wheels with auditwheel: ROCm libraries excluded, others grafted, RPATHs rewritten.

    Settings come from --settings, else from the wheel's build description (its provenance record,
    or its recipe and lock line by its label) when the recipes folder has them, plus the options given.
    """
    from pipeline.standalone import RepairOptions, repair_files

    options = RepairOptions(
        settings_file=settings_file,
        rocm=rocm,
        rocm_lib_dir=rocm_lib_dir,
        excludes=exclude,
        link_packages=link_package,
        extra_rpath=rpath,
        plat=plat,
        requires_pins=requires_pin,
        rocm_wheels=rocm_provider == "wheels",
    )
    output = (wheel_dir or obj.layout.repaired).resolve()
    for repaired in repair_files(obj.layout, _wheel_paths(wheels), output, options):
        click.echo(str(repaired))


@cli.command("verify")
@click.argument("wheels", nargs=-1, type=FILE)
@click.option("--arch", default=None, help="GPU targets the wheels must carry (missing: error, extra: warning)")
@click.option("--rocm", default=None, help="lock line to check against (default: from the wheel's +rocm label)")
@click.option(
    "--rocm-lib-dir", default=None, help="ROCm library folder of the target machines (default: the lock line's)"
)
@click.option("--no-smoke", is_flag=True, help="skip the install-and-import test")
@click.option("--json", "as_json", is_flag=True, help="machine-readable report")
@click.pass_obj
def verify_command(
    obj: Context,
    wheels: tuple[Path, ...],
    arch: str | None,
    rocm: str | None,
    rocm_lib_dir: str | None,
    no_smoke: bool,
    as_json: bool,
) -> None:
    """Prove what is inside each wheel; exit status 1 on any error."""
    from pipeline.standalone import verify_files
    from pipeline.verify.verify import format_report, reports_json

    # --arch "" is a mistake, not "no target check": only a missing --arch skips the check.
    targets = parse_targets(arch) if arch is not None else None
    reports = verify_files(
        obj.layout, _wheel_paths(wheels), targets=targets, rocm=rocm, rocm_lib_dir=rocm_lib_dir, smoke=not no_smoke
    )
    click.echo(reports_json(reports) if as_json else "\n".join(format_report(r) for r in reports))
    if not all(r.ok for r in reports):
        sys.exit(1)


@cli.command("inspect")
@click.argument("wheels", nargs=-1, type=FILE)
@click.option(
    "--rocm-lib-dir",
    default=None,
    help="where ROCm libraries are expected on the target machines "
    "(default: the wheel's lock line's; for a wheel the project cannot tell, /opt/rocm/lib or the ROCm packages)",
)
@click.pass_obj
def inspect_command(obj: Context, wheels: tuple[Path, ...], rocm_lib_dir: str | None) -> None:
    """Table of a wheel's ELF files: needed libraries by origin, RPATHs, GPU targets."""
    from rich.console import Console

    from pipeline.standalone import inspect_files
    from pipeline.verify.inspect_table import render

    # Piped output keeps whole library names rather than folding them at 80 columns.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    for analysis in inspect_files(obj.layout, _wheel_paths(wheels), rocm_lib_dir):
        render(analysis, console)


@cli.command("publish")
@click.option(
    "--repository",
    "-r",
    required=True,
    envvar="ROCWHEELS_REPOSITORY",
    help="the index's upload URL (http://host:8080/) or a section NAME in .pypirc",
)
@click.option("--simple-url", default=None, help="its PEP 503 root when not <upload URL>/simple/ (devpi: .../+simple/)")
@click.option("--config-file", type=FILE, default=None, help=".pypirc (default ~/.pypirc)")
@click.option(
    "--attempts",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="tries while the index is unreachable or answers 5xx (waits 2, 4, 8 s)",
)
@timeout_option
@click.pass_obj
def publish_command(
    obj: Context, repository: str, simple_url: str | None, config_file: Path | None, attempts: int, timeout: float
) -> None:
    """Upload the wheelhouse's wheels with twine; files already there (same sha256) are skipped."""
    from pipeline.publish.admission import REFUSAL_FIX, refusal_summary
    from pipeline.publish.upload import publish

    with wheelhouse_lock(obj.layout.wheelhouse):
        result = publish(
            obj.layout.wheelhouse,
            repository,
            project=obj.layout,
            config_file=config_file,
            simple_url=simple_url,
            attempts=attempts,
            timeout=timeout,
        )
    click.echo(
        f"{result.repository_url}: {len(result.uploaded)} uploaded, {len(result.skipped)} already there, "
        f"{len(result.records)} provenance records beside them"
    )
    if result.refused:
        raise RocwheelsError(
            f"{len(result.refused)} wheel(s) refused, not uploaded: {refusal_summary(result.refused)}", fix=REFUSAL_FIX
        )


@cli.group("key")
def key_group() -> None:
    """Keys that sign provenance records (docs/ci.md: Signed provenance)."""


@key_group.command("new")
@click.option(
    "--out",
    type=FILE,
    required=True,
    help="file for the private key (never overwritten; keep it out of the repository)",
)
def key_new(out: Path) -> None:
    """Make a signing key pair: the private key to OUT, the public key to the lock."""
    from pipeline.verify.signing import KEY_ENV, new_key

    key = new_key(out)
    click.echo(f"private key: {out} (yours only: store its one line as the CI secret {KEY_ENV}, then delete the file)")
    click.echo(f"public key: {key.public}")
    click.echo(f'trust it: add "{key.public}" to [signing] public_keys in recipes/lock.toml')


@cli.group("index")
def index_group() -> None:
    """What teammates install from: static per-line indexes, constraints, the served index's users."""


@index_group.command("build")
@click.option(
    "--index-url",
    default=None,
    help="the team index's PEP 503 root (http://host:8080/simple/): pin what it holds, warn where the wheelhouse differs",
)
@timeout_option
@click.pass_obj
def index_build(obj: Context, index_url: str | None, timeout: float) -> None:
    """Write wheelhouse/simple/<line>/ (PEP 503), constraints-<line>.txt (exact pins) and
    requirements-<line>.txt (the same pins with hashes, for --require-hashes)."""
    from pipeline.publish.admission import REFUSAL_FIX, refusal_summary
    from pipeline.publish.index import build_team_index

    built = build_team_index(obj.layout, index_url, timeout=timeout)
    for kind, path in built.written:
        click.echo(f"{kind}: {path}{'/' if kind == 'index' else ''}")
    if built.refused:
        raise RocwheelsError(
            f"{len(built.refused)} wheel(s) refused, left out of the index and pin files: "
            + refusal_summary(built.refused),
            fix=REFUSAL_FIX,
        )


@index_group.command("mirror")
@click.option("--rocm", "line_name", required=True, help='a lock line with rocm_provider = "wheels"')
@click.option(
    "--packages",
    type=FOLDER,
    default=Path("index/packages"),
    show_default=True,
    help="the folder the private index serves (rocwheels serve --packages)",
)
@click.option(
    "--with-build", is_flag=True, help="also the builder's packages (the devel extra), for builders without internet"
)
@click.pass_obj
def index_mirror(obj: Context, line_name: str, packages: Path, with_build: bool) -> None:
    """Copy a `wheels` line's ROCm wheels from AMD's index into the private index."""
    from pipeline.config.rocm_wheels import mirror

    line = lockmod.load_lock(obj.layout.recipes_dir).line(line_name)
    for wheel in mirror(line_name, line, packages, with_build=with_build):
        click.echo(f"mirrored: {wheel}")


@index_group.command("add-user")
@click.argument("username")
@click.option("--htpasswd", type=FILE, default=Path("index/htpasswd"), show_default=True)
@click.password_option(envvar="ROCWHEELS_INDEX_PASSWORD")
def index_add_user(username: str, htpasswd: Path, password: str) -> None:
    """Create or update an upload login for `rocwheels serve`."""
    from pipeline.publish.serve import add_htpasswd_user

    add_htpasswd_user(htpasswd, username, password)


@cli.command("serve")
@click.option("--packages", type=FOLDER, default=Path("index/packages"), show_default=True)
@click.option("--htpasswd", type=FILE, default=Path("index/htpasswd"), show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="0.0.0.0 to serve the team")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.pass_obj
def serve_command(obj: Context, packages: Path, htpasswd: Path, host: str, port: int) -> None:
    """Run a private index (pypiserver) until Ctrl-C; uploads need an htpasswd login; its log: PACKAGES/../pypiserver.log."""
    from pipeline.publish.index import line_settings
    from pipeline.publish.serve import serve

    # pypiserver's own output (requests, and a traceback if it fails) goes to a file beside the packages.
    serve(
        packages,
        htpasswd,
        host=host,
        port=port,
        log_file=packages.parent / "pypiserver.log",
        lines=line_settings(obj.layout),
    )


@cli.command("demo")
@click.option(
    "--arch",
    envvar="ROCWHEELS_ARCH",
    default=None,
    help="GPU targets (default: every target this host's compiler takes)",
)
@click.pass_obj
def demo_command(obj: Context, arch: str | None) -> None:
    """The canary through the whole job on this host: build, repair, verify, publish, install."""
    from rich.console import Console
    from rich.table import Table

    from pipeline.demo import CANARY, run_demo

    steps = run_demo(select_plan(obj.layout, CANARY, arch, None, "local"), obj.layout)
    table = Table(title="rocwheels demo")
    for column in ("step", "result", "time"):
        table.add_column(column)
    for step in steps:
        table.add_row(step.name, step.result, f"{step.seconds:.1f} s" if step.seconds else "")
    Console().print(table)


@cli.group("ci")
def ci_group() -> None:
    """The CI job: the build matrix for .github/workflows/wheels.yml and .gitlab-ci.yml."""


@ci_group.command("matrix")
@click.option(
    "--rocm",
    envvar="ROCWHEELS_ROCM",
    default=None,
    help="lock line (recipes/lock.toml [lines.NAME]); default: default_line",
)
@click.option("--arch", default=None, envvar="ROCWHEELS_ARCH", help="GPU targets (default: every target of the line)")
@click.option(
    "--recipes", default=None, help="recipes, comma separated (default: all in the line); dependencies are added"
)
@click.option("--driver", type=click.Choice(DRIVERS), default="container", envvar="ROCWHEELS_DRIVER", show_default=True)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(("json", "github", "gitlab")),
    default="json",
    show_default=True,
    help="github: key=value lines for $GITHUB_OUTPUT; gitlab: the child pipeline",
)
@click.option(
    "--output",
    type=FILE,
    default=None,
    help="write there instead of stdout (github: appended, as $GITHUB_OUTPUT wants)",
)
@click.pass_obj
def ci_matrix_command(
    obj: Context,
    rocm: str | None,
    arch: str | None,
    recipes: str | None,
    driver: str,
    output_format: str,
    output: Path | None,
) -> None:
    """The line's recipe x Python jobs in dependency stages, from the same plan as `make wheels`."""
    from pipeline.ci import ci_matrix, render

    # Each recipe builds for the requested targets it supports; the matrix notes the rest.
    plan = select_plan(obj.layout, recipes, arch, rocm, driver, narrow=True)
    if driver == "container":
        from pipeline.build.container import require_pinned

        # No build job may fan out on a lock it would refuse: the matrix is the pipeline's preflight.
        require_pinned(plan.line_name, plan.line, obj.layout.recipes_dir)
    for note in plan.notes:
        log.warning("note: %s", note)
    matrix = ci_matrix(plan_document(plan))
    text = render(matrix, output_format, arch=";".join(matrix.targets), recipes=recipes)
    if output is None:
        click.echo(text, nl=False)
    else:
        with output.open("a" if output_format == "github" else "w", encoding="utf-8") as sink:
            sink.write(text)


@cli.group("image")
def image_group() -> None:
    """The builder image (docker/Dockerfile.builder) and the Debian bases made without a registry."""


@image_group.command("build")
@rocm_line_option
@engine_option
@click.pass_obj
def image_build(obj: Context, rocm: str | None, engine_name: str | None) -> None:
    """Build (or find, when its inputs are unchanged) the builder image of a lock line; print its tag."""
    from pipeline.build.container import builder_image
    from pipeline.build.engine import detect_engine

    name, line = lockmod.select_line(lockmod.load_lock(obj.layout.recipes_dir), rocm)
    click.echo(builder_image(name, line, detect_engine(engine_name), recipes_dir=obj.layout.recipes_dir))


@image_group.command("base")
@click.option(
    "--suite",
    type=click.Choice(("bookworm", "trixie", "sid")),
    required=True,
    help="bookworm: HIP 5.2 (gfx90a, gfx940); trixie: HIP 5.7 (also gfx942); sid: HIP 6.4, hipcc 7 (also gfx950, compressed bundles)",
)
@engine_option
@click.pass_obj
def image_base(obj: Context, suite: str, engine_name: str | None) -> None:
    """Make localhost/rocwheels-base:SUITE from Debian's HIP packages (debootstrap, as root; ~90 s, ~1 GB)."""
    from pipeline.build.engine import detect_engine
    from pipeline.build.image import PROJECT_ROOT
    from pipeline.util.cmd import run
    from pipeline.util.progress import long_step

    engine = detect_engine(engine_name)
    image = f"localhost/rocwheels-base:{suite}"
    log_file = obj.layout.logs / f"image-base-{suite}.log"
    with long_step(f"image base {suite}", log) as on_output:
        run(
            ["bash", PROJECT_ROOT / "docker" / "test-base" / "make-base.sh", suite, image],
            env={**engine.env, "ROCWHEELS_ENGINE": engine.name},
            log_file=log_file,
            on_output=on_output,
        )
    click.echo(image)


@image_group.command("test")
@rocm_line_option
@engine_option
@click.pass_obj
def image_test_command(obj: Context, rocm: str | None, engine_name: str | None) -> None:
    """Run rocminfo in the line's builder image with this host's GPU passed in; exit 1 unless it sees one."""
    from pipeline.build.container import builder_image
    from pipeline.build.engine import detect_engine
    from pipeline.doctor import DEV, device_check, format_check, image_test

    # Without a GPU there is nothing to test: say so before building an image for nothing.
    check = device_check(DEV / "kfd")
    if check.ok:
        engine = detect_engine(engine_name)
        name, line = lockmod.select_line(lockmod.load_lock(obj.layout.recipes_dir), rocm)
        check = image_test(engine, builder_image(name, line, engine, recipes_dir=obj.layout.recipes_dir))
    click.echo(format_check(check))
    if check.ok is not True:
        sys.exit(1)


@cli.command("doctor")
@click.option(
    "--arch",
    envvar="ROCWHEELS_ARCH",
    default=None,
    help="GPU targets the wheels are built for (checked against this host's GPUs)",
)
@click.option("--rocm", envvar="ROCWHEELS_ROCM", default=None, help="lock line to compare the host's ROCm with")
@engine_option
@click.pass_obj
def doctor_command(obj: Context, arch: str | None, rocm: str | None, engine_name: str | None) -> None:
    """Check this host: container engine, GPU devices and groups, GPUs vs ARCH, ROCm vs the lock line."""
    from pipeline.doctor import format_check, run_doctor

    line = lockmod.load_lock(obj.layout.recipes_dir).line(rocm) if rocm else None
    checks = run_doctor(arch, line, line_name=rocm, engine=engine_name)
    for check in checks:
        click.echo(format_check(check))
    if any(check.ok is False for check in checks):
        sys.exit(1)


def driver_for(driver: str, plan: Plan, layout: Layout) -> Driver:
    if driver == "local":
        from pipeline.build.local import local_driver_for

        return local_driver_for(plan)
    from pipeline.build.container import container_driver

    return container_driver(plan, layout)


def main() -> None:
    """The one place the project's errors become messages and exit statuses: 2 bad input (usage,
    recipe, lock, option values), 1 a failed check or step, 128 + N for signal N (130 Ctrl-C, 143
    SIGTERM); never a traceback for any of them."""
    from pipeline.util.files import write_error
    from pipeline.util.interrupts import interruptible

    try:
        with interruptible():
            cli(standalone_mode=False)
    except RocwheelsError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except Interrupted as exc:
        click.echo(
            f"interrupted by signal {exc.signum}: temporary files removed; run the command again to continue", err=True
        )
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except OSError as exc:  # a full, read-only or forbidden folder no stage named more closely
        error = write_error(exc, None)
        if error is None:
            raise
        click.echo(f"error: {error}", err=True)
        sys.exit(error.exit_code)
