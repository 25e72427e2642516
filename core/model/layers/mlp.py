"""SiLU-gated MLP: down(silu(gate x) * up x), gate and up fused in one GEMM."""

from __future__ import annotations

from typing import Any

import torch
from infer.core.model.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from torch import nn


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, ctx: Any,
                 bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], bias=bias, ctx=ctx)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias, ctx=ctx)
        self._silu_and_mul = ctx.ops.silu_and_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [T, 2I]
        return self.down_proj(self._silu_and_mul(gate_up))  # [T, hidden]
