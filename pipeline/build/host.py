"""What this host's ROCm toolchain is: its release and which GPU targets its compiler accepts."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from pipeline.config.toolchain import HIP_ENV, ROCM_PATH
from pipeline.util.cmd import run


def host_rocm_version() -> str | None:
    """``major.minor`` of the host ROCm: ``$ROCM_PATH/.info/version`` (AMD's packages) or hipcc's
    HIP version (distribution packages)."""
    info = Path(os.environ.get("ROCM_PATH", ROCM_PATH)) / ".info" / "version"
    if info.is_file():
        match = re.match(r"(\d+\.\d+)", info.read_text())
        if match:
            return match.group(1)
    hipcc = shutil.which("hipcc")
    if hipcc is None:
        return None
    result = run([hipcc, "--version"], env=HIP_ENV, check=False, quiet=True)
    match = re.search(r"HIP version: (\d+\.\d+)", result.output)
    return match.group(1) if match else None
