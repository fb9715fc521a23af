"""``rocwheels doctor``: is this host ready to build, and to run what it builds?

Each check says what it found and, when it fails, what to do. ``ok`` is None where a check does
not apply (no rocminfo installed, no lock line chosen): building wheels needs neither a GPU nor a
host ROCm, only a container engine; running their GPU checks needs the rest.
"""

from __future__ import annotations

import grp
import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.build.engine import Engine, _last_line, detect_engine
from pipeline.build.host import host_rocm_version
from pipeline.config.lock import Line, same_release
from pipeline.config.rocm_wheels import torch_provider
from pipeline.config.targets import parse_targets, runs_on
from pipeline.errors import RocwheelsError
from pipeline.util.cmd import run

DEV = Path("/dev")
GPU_GROUPS = ("video", "render")
GROUPS_FIX = "add the user to the render and video groups (`sudo usermod -aG render,video $USER`), then log in again"
NO_GPU_FIX = (
    "building needs no GPU; GPU smoke tests and `rocwheels image test` do: run them on a host with an AMD GPU "
    "and the amdgpu kernel driver (AMD's amdgpu-dkms, or the distribution kernel's amdgpu module)"
)
_AGENT_NAME = re.compile(r"^\s*Name:\s+(gfx[0-9a-f]+)\s*$", re.M)
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # rocminfo colours its errors


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None: does not apply here
    detail: str
    fix: str | None = None


def format_check(check: Check) -> str:
    """``✓ name: detail``; a check that did not pass adds its fix on the next line."""
    mark = {True: "✓", False: "✗", None: "–"}[check.ok]
    text = f"{mark} {check.name}: {check.detail}"
    return f"{text}\n    fix: {check.fix}" if check.fix and check.ok is not True else text


def run_doctor(
    arch: str | None, line: Line | None, *, line_name: str | None = None, dev: Path = DEV, engine: str | None = None
) -> list[Check]:
    """Every host check; ``arch`` (an ARCH string) and ``line`` narrow what the GPU and ROCm checks expect,
    ``engine`` (podman or docker) the engine checked."""
    wanted = tuple(t.processor for t in parse_targets(arch)) if arch else ()
    return [
        engine_check(engine),
        device_check(dev / "kfd"),
        render_nodes_check(dev / "dri"),
        groups_check(),
        gpu_targets_check(wanted),
        host_rocm_check(line, line_name),
        installed_torch_check(),
    ]


def installed_torch_check(search_path: Sequence[str] = tuple(sys.path)) -> Check:
    """Whether the torch of this Python takes ROCm from the machine or from ROCm wheels (TheRock)."""
    found = torch_provider(search_path)
    if found is None:
        return Check("installed torch", None, "no torch in this Python environment")
    provider, detail = found
    return Check(
        "installed torch",
        provider != "none",
        f"ROCm provider: {provider}: {detail}",
        None if provider != "none" else "install a ROCm build of torch (this one runs on the CPU or CUDA only)",
    )


def engine_check(only: str | None = None) -> Check:
    try:
        engine = detect_engine(only)
    except RocwheelsError as exc:
        return Check("container engine", False, exc.message, exc.fix)
    where = (
        f", DOCKER_HOST={os.environ['DOCKER_HOST']}"
        if engine.name == "docker" and os.environ.get("DOCKER_HOST")
        else ""
    )
    return Check("container engine", True, f"{engine.name} ({engine.argv_prefix[0]}{where}) answers `info`")


def device_check(kfd: Path) -> Check:
    """The ROCm compute device: without it no HIP program finds a GPU."""
    if not kfd.exists():
        return Check(str(kfd), False, f"no AMD GPU on this host ({kfd} missing)", NO_GPU_FIX)
    if not os.access(kfd, os.R_OK | os.W_OK):
        return Check(str(kfd), False, f"{kfd} is not readable and writable by this user", GROUPS_FIX)
    return Check(str(kfd), True, "present, readable and writable")


def render_nodes_check(dri: Path) -> Check:
    """The GPUs' render nodes (``renderD*``), which HIP opens next to the compute device."""
    nodes = sorted(dri.glob("renderD*")) if dri.is_dir() else []
    if not nodes:
        return Check(str(dri), False, f"no GPU render nodes ({dri}/renderD*)", NO_GPU_FIX)
    denied = [node.name for node in nodes if not os.access(node, os.R_OK | os.W_OK)]
    if denied:
        return Check(str(dri), False, f"not readable and writable by this user: {', '.join(denied)}", GROUPS_FIX)
    return Check(str(dri), True, f"{', '.join(node.name for node in nodes)} readable and writable")


def groups_check() -> Check:
    if os.geteuid() == 0:
        return Check("groups", True, "running as root: device access does not depend on groups")
    existing = [name for name in GPU_GROUPS if _group_exists(name)]
    mine = {grp.getgrgid(gid).gr_name for gid in {os.getgid(), *os.getgroups()}}
    missing = [name for name in existing if name not in mine]
    if missing:
        return Check("groups", False, f"this user is not in: {', '.join(missing)}", GROUPS_FIX)
    return Check("groups", True, f"member of {', '.join(existing) or 'no GPU group (none exists here)'}")


def gpu_targets_check(wanted: tuple[str, ...]) -> Check:
    """The GPUs rocminfo reports, against the targets the wheels are built for."""
    name = "GPU targets"
    rocminfo = shutil.which("rocminfo")
    if rocminfo is None:
        return Check(
            name,
            None,
            "rocminfo not installed: GPUs not listed",
            "install rocminfo (Debian/Ubuntu: apt-get install rocminfo; or ROCm's rocminfo package)",
        )
    result = run([rocminfo], check=False, quiet=True)
    if result.returncode != 0:
        return Check(
            name,
            None,
            f"rocminfo failed (exit {result.returncode}): {_conclusion(result.output)}",
            "none needed to build; to use a GPU here, make /dev/kfd work (see the checks above)",
        )
    found = tuple(dict.fromkeys(_AGENT_NAME.findall(result.output)))
    if not found:
        return Check(name, False, "rocminfo lists no GPU agent", NO_GPU_FIX)
    # A generic target (gfx9-4-generic) has code for the processors it serves.
    unbuilt = [gpu for gpu in found if wanted and not any(runs_on(target, gpu) for target in wanted)]
    if unbuilt:
        return Check(
            name,
            False,
            f"this host has {', '.join(found)}; ARCH={';'.join(wanted)} has no code for {', '.join(unbuilt)}",
            f"add {', '.join(unbuilt)} to ARCH to run the wheels' GPU code on this host",
        )
    return Check(name, True, f"this host has {', '.join(found)}")


def host_rocm_check(line: Line | None, line_name: str | None) -> Check:
    """The host ROCm release: local builds use it, and the wheels load its libraries at run time."""
    name = "host ROCm"
    host = host_rocm_version()
    if host is None:
        return Check(
            name,
            None,
            "no ROCm on this host (no /opt/rocm/.info/version, no hipcc)",
            "none needed for container builds; to run the wheels here, install the ROCm release of the lock line",
        )
    if line is None:
        return Check(name, True, f"ROCm {host}")
    wanted = ".".join(line.rocm.split(".")[:2])
    label = f"line {line_name} " if line_name else "the lock line "
    if not same_release(line.rocm, host):
        return Check(
            name,
            False,
            f"ROCm {host} here, {label}is ROCm {line.rocm}: its wheels need that release's libraries",
            f"build and run them on a ROCm {wanted} host, or pick the line of this host's ROCm (--rocm)",
        )
    return Check(name, True, f"ROCm {host}, as {label}(ROCm {line.rocm})")


def image_test(engine: Engine, tag: str, *, kfd: Path = DEV / "kfd") -> Check:
    """Run rocminfo in the builder image with the GPU passed in; no container at all without a GPU."""
    name = "GPU in the builder image"
    if not kfd.exists():
        # The engine would fail anyway ("stat /dev/kfd: no such file or directory", exit 125).
        return Check(name, None, f"no AMD GPU on this host ({kfd} missing): the image was not started", NO_GPU_FIX)
    result = run(
        engine.command(
            "run",
            "--rm",
            "--device",
            str(kfd),
            "--device",
            str(kfd.parent / "dri"),
            "--group-add",
            "video",
            tag,
            "rocminfo",
        ),
        env=engine.env,
        check=False,
    )
    found = tuple(dict.fromkeys(_AGENT_NAME.findall(result.output)))
    # Judged by the output too: the docker CLI in front of podman can report 0 for a failed --rm run.
    if result.returncode != 0 or not found:
        return Check(
            name,
            False,
            f"rocminfo in {tag} found no GPU (exit {result.returncode}): {_conclusion(result.output)}",
            "check the host (rocwheels doctor), then that the image's ROCm supports this GPU",
        )
    return Check(name, True, f"rocminfo in {tag} sees {', '.join(found)}")


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def _conclusion(output: str) -> str:
    """The last line a tool printed (its verdict), without colour codes."""
    return _last_line(_COLOUR.sub("", output))
