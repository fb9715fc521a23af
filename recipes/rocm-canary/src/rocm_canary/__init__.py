"""rocm-canary: the smallest wheel that proves a ROCm build and install works.

Importing it loads the HIP runtime (the extension links it); ``built_targets()`` says which
GPU targets were compiled in; ``run_kernel()`` needs a GPU.
"""

from ._build_info import OFFLOAD_TARGETS
from ._canary import device_count, run_kernel, runtime_version

__all__ = ["built_targets", "device_count", "run_kernel", "runtime_version"]


def built_targets() -> tuple:
    return OFFLOAD_TARGETS
