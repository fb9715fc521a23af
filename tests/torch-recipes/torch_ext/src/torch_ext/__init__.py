"""``add_one(x)``: x + 1, computed by the C++ op ``torch.ops.torch_ext.add_one``."""

import torch

from . import _C  # noqa: F401 (registers the op)

add_one = torch.ops.torch_ext.add_one
