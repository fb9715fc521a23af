"""Running this checkout's rocwheels in a throwaway container: a bare image's python3, the checkout
mounted read-only, no network, and whatever limits the test sets (``--memory 700m``)."""

from __future__ import annotations

from pathlib import Path

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
