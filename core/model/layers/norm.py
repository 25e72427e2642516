"""RMSNorm: x / sqrt(mean(x^2) + eps) * weight, reduced in float32, output in x's dtype.

``norm(x)`` returns the normed x; ``norm(x, residual)`` adds first and returns
``(norm(x + residual), x + residual)``: the residual add of a pre-norm block fused with its norm
(one kernel where the platform has one, see ``infer.core.ops.layer_ops``).
"""

from __future__ import annotations

import torch
from infer.core.ops.layer_ops import REFERENCE_OPS, LayerOps
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6,
                 dtype: torch.dtype = torch.float32, ops: LayerOps | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.eps = eps
        self._op = (ops or REFERENCE_OPS).rms_norm

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x [..., hidden] -> same shape and dtype (and the new residual when one is given)."""
        out, res = self._op(x, self.weight, self.eps, residual)
        return out if residual is None else (out, res)
