"""The default (unquantized) linear method: a dense weight [out, in] applied with torch's matmul
(the device's own GEMM library picks the kernel)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from infer.core.ops.linear import LinearMethod
from torch import nn


class DenseLinearMethod(LinearMethod):
    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        return F.linear(x, layer.weight, layer.bias)
