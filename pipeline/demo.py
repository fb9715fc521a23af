"""``make demo``: the whole job on the canary, on this host, from nothing.

build -> repair -> verify -> publish to a local pypiserver on a free loopback port -> install
from it into a fresh venv -> smoke test -> stop the server. Leaves no process running. All of it
happens in the demo's own folder (``demo/`` in the work folder): the user's wheelhouse, and what
it holds, are never read or written.
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.layout import Layout, fresh_dir
from pipeline.errors import RocwheelsError
from pipeline.plan import Plan
from pipeline.publish.index import build_static_index, wheels_by_label, write_constraints
from pipeline.publish.serve import add_htpasswd_user, running_pypiserver
from pipeline.publish.upload import publish
from pipeline.util.cmd import run
from pipeline.verify.host_gpus import gpu_check_for_build
from pipeline.wheels import make_wheels

CANARY = "rocm-canary"


@dataclass(frozen=True)
class DemoStep:
    name: str
    result: str
    seconds: float


@contextmanager
def _timed(steps: list[DemoStep], name: str) -> Iterator[list[str]]:
    """Time one demo step; the body appends its one-line result."""
    started = time.monotonic()
    result: list[str] = []
    yield result
    steps.append(DemoStep(name, " ".join(result), time.monotonic() - started))


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def demo_layout(layout: Layout) -> Layout:
    """The demo's own wheelhouse and work folder, inside the work folder of ``layout``."""
    root = layout.work_dir / "demo"
    return Layout(layout.recipes_dir, root / "wheelhouse", root / "work")


def run_demo(plan: Plan, project: Layout) -> list[DemoStep]:
    """The demo's steps, in :func:`demo_layout` of ``project``: emptied first, since every wheel
    in its wheelhouse is published."""
    layout = demo_layout(project)
    fresh_dir(layout.wheelhouse)
    steps: list[DemoStep] = []
    with _timed(steps, "build, repair, verify") as result:
        (outcome,) = [o for o in make_wheels(plan, layout, force=True) if o.recipe == CANARY]
        if not outcome.wheels:
            raise RocwheelsError(
                f"the canary did not reach the wheelhouse: {outcome.detail}", fix=f"see {layout.log_file(CANARY)}"
            )
        result.append(f"{', '.join(w.name for w in outcome.wheels)} in {layout.wheelhouse}")
    version = plan.steps[-1].wheel_version
    with tempfile.TemporaryDirectory(prefix="rocwheels-demo-") as scratch:
        root = Path(scratch)
        password = secrets.token_urlsafe(16)
        add_htpasswd_user(root / "htpasswd", "demo", password)
        with running_pypiserver(root / "packages", root / "htpasswd", log_file=layout.logs / "demo-index.log") as index:
            with (
                _timed(steps, "publish (twine -> pypiserver)") as result,
                _environment(TWINE_USERNAME="demo", TWINE_PASSWORD=password),
            ):
                published = publish(layout.wheelhouse, index.url, project=layout, attempts=2)
                result.append(
                    f"{len(published.uploaded)} uploaded, {len(published.skipped)} already there, {index.url}"
                )
            with _timed(steps, "static index + constraints") as result:
                lines = wheels_by_label(layout.wheelhouse)
                roots = build_static_index(layout.wheelhouse, lines)
                constraints = write_constraints(layout.wheelhouse, lines)
                result.append(", ".join(p.name for p in (*roots, *constraints)))
            with _timed(steps, "install into a fresh venv") as result:
                python = _fresh_venv(root / "venv")
                run(
                    [
                        python,
                        "-m",
                        "pip",
                        "install",
                        "--disable-pip-version-check",
                        "-q",
                        "--extra-index-url",
                        index.simple_url,
                        f"{CANARY}=={version}",
                    ],
                    cwd=root,
                )
                installed = run(
                    [python, "-c", "import importlib.metadata as m; print(m.version('rocm-canary'))"], cwd=root
                ).output.strip()
                if installed != version:
                    raise RocwheelsError(f"pip installed rocm-canary {installed}, not the build {version}")
                result.append(f"rocm-canary=={installed} from {index.simple_url}")
            with _timed(steps, "smoke test") as result:
                gpu = gpu_check_for_build(plan.steps[-1].targets)
                outputs = [
                    run([python, "-c", snippet], cwd=root).output.strip()
                    for snippet in plan.steps[-1].recipe.smoke.snippets(gpu=gpu.run)
                ]
                result.append(f"{' '.join(o for o in outputs if o) or 'imported'}; {gpu.outcome()}")
    steps.append(DemoStep("index server", "stopped", 0.0))
    return steps


def _fresh_venv(folder: Path) -> Path:
    run([sys.executable, "-m", "venv", folder])
    return folder / "bin" / "python"
