"""The ``rocwheels`` command line: parses options and calls one stage function each."""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from . import lock as lockmod
from .errors import RocwheelsError
from .host import host_rocm_version
from .layout import Layout
from .log import setup_logging
from .plan import Plan, describe, make_plan
from .recipes import load_recipes
from .targets import parse_targets

log = logging.getLogger("rocwheels")
DRIVERS = ("local", "container")


@dataclass(frozen=True)
class Context:
    layout: Layout


def _split(value: str | None) -> list[str]:
    return [part for part in re.split(r"[;,\s]+", value or "") if part]


def load_plan(layout: Layout, recipes: str | None, arch: str, rocm: str | None, driver: str) -> Plan:
    """Everything checked before anything runs: recipes, lock, line, targets, order."""
    targets = parse_targets(arch)
    all_recipes = load_recipes(layout.recipes_dir)
    lock_file = lockmod.load_lock(layout.recipes_dir)
    for warning in lockmod.check_lock(lock_file, all_recipes):
        log.warning("warning: %s", warning)
    host = host_rocm_version() if driver == "local" and not rocm else None
    if driver == "local" and not rocm and host is None:
        raise RocwheelsError("no ROCm toolchain found on this host (no /opt/rocm/.info/version, no hipcc)",
                             fix="install ROCm (on Debian: apt-get install hipcc), or build in the container with DRIVER=container")
    line_name, line = lockmod.select_line(lock_file, rocm, host)
    wanted = _split(recipes) or list(line.versions)
    return make_plan(all_recipes, wanted, recipes_dir=layout.recipes_dir, line_name=line_name, line=line, targets=targets)


def target_options(command):
    """The options that choose what to build: recipes, GPU targets, ROCm line, driver."""
    command = click.option("--driver", type=click.Choice(DRIVERS), default="local", envvar="DRIVER", show_default=True,
                           help="local: this host's ROCm; container: the lock line's builder image")(command)
    command = click.option("--rocm", "rocm", envvar="ROCM", default=None,
                           help="lock line (recipes/lock.toml [lines.NAME]); default: the host's ROCm (local) or default_line")(command)
    command = click.option("--arch", required=True, envvar="ARCH",
                           help="GPU targets: gfx942, 'gfx90a;gfx942' or gfx90a,gfx942")(command)
    command = click.option("--recipes", envvar="RECIPES", default=None,
                           help="recipes to build, comma separated (default: all in the line); dependencies are added")(command)
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--recipes-dir", type=click.Path(path_type=Path, file_okay=False), default=Path("recipes"), show_default=True, envvar="ROCWHEELS_RECIPES")
@click.option("--wheelhouse", type=click.Path(path_type=Path, file_okay=False), default=Path("wheelhouse"), show_default=True, envvar="ROCWHEELS_WHEELHOUSE")
@click.option("--work-dir", type=click.Path(path_type=Path, file_okay=False), default=Path("build"), show_default=True, envvar="ROCWHEELS_WORK_DIR",
              help="sources, build environments and raw wheels")
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
    lines = ", ".join(f"{name} (ROCm {line.rocm}: {len(line.versions)} recipes)" for name, line in lock_file.lock.lines.items())
    click.echo(f"{lock_file.path}: consistent; lines: {lines}")


@cli.command("plan")
@target_options
@click.pass_obj
def plan_command(obj: Context, recipes: str | None, arch: str, rocm: str | None, driver: str) -> None:
    """Print the ordered build steps with their environment and commands; runs nothing."""
    click.echo(describe(load_plan(obj.layout, recipes, arch, rocm, driver)))


@cli.command("build")
@target_options
@click.pass_obj
def build_command(obj: Context, recipes: str | None, arch: str, rocm: str | None, driver: str) -> None:
    """Build raw wheels into the work folder (no repair or verify: see `wheels`)."""
    from .build import build_local

    plan = load_plan(obj.layout, recipes, arch, rocm, driver)
    for step in plan.steps:
        built = build_local(step, obj.layout)
        click.echo(f"{built.recipe}: raw wheel {built.path}")


def main() -> None:
    try:
        cli(standalone_mode=False)
    except RocwheelsError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
