"""``triton`` MoE runner: the fused Triton kernels of infer_cuda.kernels.fused_moe."""

from __future__ import annotations

import torch
from infer.core.ops.moe import MoERunner

from infer_cuda.kernels.fused_moe import fused_moe


class TritonMoERunner(MoERunner):
    name = "triton"

    @torch.compiler.disable  # launched as is inside a torch.compile'd model (a graph break)
    def apply(self, hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """hidden [T, D], w13 [E, 2I, D], w2 [E, D, I], topk_* [T, k] -> [T, D]."""
        return fused_moe(hidden, w13, w2, topk_weights, topk_ids)
