"""Facts about the toolchain that every stage shares: where AMD's packages install ROCm, the
environment hipcc needs, and the CPython tag of a Python version."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

ROCM_PATH = "/opt/rocm"  # AMD's packages install ROCm here; a lock line may name another (`rocm_path`)

# hipcc compiles for NVIDIA through an nvcc it finds installed unless told the platform is AMD's.
HIP_ENV: Mapping[str, str] = MappingProxyType({"HIP_PLATFORM": "amd"})


def rocm_lib_dir(rocm_path: str = ROCM_PATH) -> str:
    """The library folder of the ROCm installed at ``rocm_path`` ("": a distribution's, in /usr)."""
    return f"{rocm_path.rstrip('/') or '/usr'}/lib"


def python_tag(python: str) -> str:
    """``cp311`` for Python ``3.11``."""
    return "cp" + python.replace(".", "")


def python_version(tag: str) -> str | None:
    """``3.11`` for the tag ``cp311``; None for a tag that names no CPython version (``py3``, ``abi3``)."""
    digits = tag.removeprefix("cp")
    return f"{digits[0]}.{digits[1:]}" if tag.startswith("cp") and len(digits) >= 2 and digits.isdigit() else None
