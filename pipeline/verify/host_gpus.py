"""The AMD GPUs of this host, and whether a wheel's GPU check can run on them.

A build host's GPU is often not one the build is for (CI builds gfx942 wheels on a gfx90a
runner): the GPU code of such a wheel cannot run there, and that says nothing about the wheel. So
a recipe's ``gpu_code`` runs only where every GPU the runtime may pick is one the wheel's code
objects run on, and this user may open ``/dev/kfd``; otherwise the check is skipped, saying why.

The GPUs are read from the amdgpu driver's KFD topology in sysfs, which needs no ROCm user space:
each node's ``properties`` has ``gfx_target_version`` (major * 10000 + minor * 100 + stepping, the
ISA version; 0 on CPU nodes), as Linux's amdkfd sets it in ``kfd_device.c`` (Aldebaran, gfx90a:
90010).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.targets import GpuTarget, runs_on

KFD = Path("/dev/kfd")
KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")


@dataclass(frozen=True)
class GpuCheck:
    run: bool
    why: str  # on which GPUs it runs, or why it does not

    def outcome(self) -> str:
        """What a smoke test that passed says of its GPU check."""
        return f"GPU check passed {self.why}" if self.run else f"GPU check not run: {self.why}"


def processor_name(gfx_target_version: int) -> str:
    """The LLVM processor of a KFD ``gfx_target_version``: 90010 -> gfx90a, 110501 -> gfx1151."""
    major, rest = divmod(gfx_target_version, 10000)
    minor, stepping = divmod(rest, 100)
    return f"gfx{major}{minor:x}{stepping:x}"


def host_gpus() -> tuple[str, ...]:
    """The processors of this host's AMD GPUs, one per GPU in the topology's node order; () without any."""
    found: list[tuple[int, str]] = []
    for node in KFD_NODES.glob("*/properties"):  # nothing where the folder is missing
        if not node.parent.name.isdecimal():
            continue
        try:
            properties = dict(line.split(maxsplit=1) for line in node.read_text().splitlines() if " " in line)
            version = int(properties.get("gfx_target_version", "0"))
        except (OSError, ValueError):
            continue
        if version:
            found.append((int(node.parent.name), processor_name(version)))
    return tuple(name for _, name in sorted(found))


def gpu_check(code_targets: Iterable[Sequence[str]] | None) -> GpuCheck:
    """Whether a GPU check of a wheel runs here. ``code_targets``: the targets of each file of the
    wheel that has GPU code objects (``gfx90a:xnack-``, ``gfx11-generic``); None for a wheel whose GPU
    code is compiled when it runs (Triton), which runs on any GPU."""
    if not KFD.exists():
        return GpuCheck(False, "no GPU here")
    if not os.access(KFD, os.R_OK | os.W_OK):
        return GpuCheck(False, f"{KFD} is not readable and writable by this user (see `rocwheels doctor`)")
    gpus = host_gpus()
    if not gpus:
        return GpuCheck(False, f"{KFD} is there but the KFD topology ({KFD_NODES}) lists no GPU")
    files = [tuple(target.split(":")[0] for target in targets) for targets in code_targets or ()]
    missing = [gpu for gpu in gpus if not all(any(runs_on(t, gpu) for t in targets) for targets in files)]
    if missing:
        built = sorted({target for targets in files for target in targets})
        return GpuCheck(
            False, f"the wheel has no code for {', '.join(sorted(set(missing)))} here (built for {', '.join(built)})"
        )
    return GpuCheck(True, f"on {', '.join(gpus)}")


def gpu_check_for_build(targets: Iterable[GpuTarget]) -> GpuCheck:
    """:func:`gpu_check` before a build, for the code objects it is asked for (``targets``)."""
    return gpu_check([tuple(map(str, targets))])
