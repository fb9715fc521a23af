"""Containers in tests: this checkout's rocwheels run in a throwaway container (a bare image's python3,
the checkout mounted read-only, no network, the limits the test sets: ``--memory 700m``), and the
container driver's settings as cibuildwheel reads them."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from cibuildwheel.options import CommandLineArguments, Options, compute_options

from pipeline.build.engine import Engine
from pipeline.util.cmd import run
from tests.helpers import REPO

CHECKOUT = "/rocwheels"


def python_in(engine: Engine, image: str, code: str, *, limits: tuple[str, ...] = (), work: Path | None = None) -> str:
    """Run ``python3 -c code`` in ``image`` with ``pipeline`` importable from the checkout; its output.

    ``work``: a host folder mounted at /work, the working folder.
    """
    volumes = (
        "--volume",
        f"{REPO}:{CHECKOUT}:ro",
        *(("--volume", f"{work}:/work", "--workdir", "/work") if work else ()),
    )
    command = engine.command(
        "run",
        "--rm",
        "--network",
        "none",
        "--env",
        f"PYTHONPATH={CHECKOUT}",
        "--env",
        "HIP_PLATFORM=amd",
        *volumes,
        *limits,
        image,
        "python3",
        "-c",
        code,
    )
    return run(command, env=engine.env).output


def cibuildwheel_reads(settings: dict[str, str], project: Path, identifier: str = "cp313-manylinux_x86_64"):
    """The build options cibuildwheel derives from ``settings``, as its own option reader does."""
    arguments = dataclasses.replace(
        CommandLineArguments.defaults(), platform="linux", config_file=os.devnull, package_dir=project
    )
    options: Options = compute_options("linux", arguments, settings)
    return options, options.build_options(identifier)
