"""SiLU-gated MLP: down(silu(gate x) * up x), gate and up fused in one GEMM."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from infer.core.model.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from torch import nn


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, ctx: Any,
                 bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], bias=bias, ctx=ctx)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias, ctx=ctx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [T, I] each
        return self.down_proj(F.silu(gate) * up)  # [T, hidden]
