"""What building HIP code here takes: the compiler's environment and the processors to try."""

from __future__ import annotations

from pathlib import Path

from pipeline.config.toolchain import HIP_ENV
from pipeline.wheel.elf import read_elf

__all__ = ["CANDIDATE_TARGETS", "HIP_ENV", "KERNEL"]

# Processors worth trying: a session keeps those the local hipcc compiles for (HIP 5.2 rejects
# gfx942 and lacks device libraries for gfx1100; newer toolchains take more).
CANDIDATE_TARGETS = ("gfx908", "gfx90a", "gfx940", "gfx942", "gfx950", "gfx1030", "gfx1100")
KERNEL = """#include <hip/hip_runtime.h>
__global__ void add_one(float* x) { x[threadIdx.x] += 1.0f; }
"""


def offload_args(targets: tuple[str, ...]) -> list[str]:
    return [f"--offload-arch={target}" for target in targets]


def fatbin_of(library: Path) -> bytes:
    """The ``.hip_fatbin`` section of a library hipcc built (which always has one)."""
    fatbin = read_elf(library).hip_fatbin
    assert fatbin is not None, f"{library} has no .hip_fatbin section"
    return fatbin
