"""Sparse MoE block: a softmax router picks top-k experts per token; the platform's MoE runner
computes the experts from stacked weights w13 [E, 2I, D] (gate rows, then up rows) and
w2 [E, D, I]. ``renormalize`` rescales the k chosen probabilities to sum to 1 (Mixtral always,
Qwen3-MoE when ``norm_topk_prob``)."""

from __future__ import annotations

from typing import Any

import torch
from infer.core.model.layers.linear import ReplicatedLinear
from torch import nn


class SparseMoE(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 renormalize: bool, ctx: Any) -> None:
        super().__init__()
        if ctx.tp_size != 1:
            raise NotImplementedError("MoE layers run with tensor-parallel size 1 only")
        if ctx.quantization == "fp8":
            raise NotImplementedError("--quantization fp8 quantizes dense linear layers only; the MoE "
                                      "runners have no fp8 expert GEMM, so MoE models are refused "
                                      "rather than served with unquantized experts (drop --quantization)")
        self.top_k, self.renormalize = top_k, renormalize
        self.intermediate_size = intermediate_size
        self.runner = ctx.moe_runner
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False,
                                     method=ctx.dense_linear_method)
        kw = {"dtype": ctx.dtype, "device": ctx.device}
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size, **kw),
                                requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size, **kw),
                               requires_grad=False)

    def load_expert(self, expert: int, which: str, loaded: torch.Tensor) -> None:
        """which: "gate" [I, D], "up" [I, D] or "down" [D, I] of one expert; "gate_up" [E, 2I, D]
        or "down_all" [E, D, I] for checkpoints that already stack the experts."""
        i = self.intermediate_size
        dest = {"gate": lambda: self.w13.data[expert, :i], "up": lambda: self.w13.data[expert, i:],
                "down": lambda: self.w2.data[expert], "gate_up": lambda: self.w13.data,
                "down_all": lambda: self.w2.data}[which]()
        if dest.shape != loaded.shape:
            raise ValueError(f"expert weight {which} shape mismatch: checkpoint "
                             f"{tuple(loaded.shape)}, model {tuple(dest.shape)}")
        dest.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, D] -> [T, D]."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)  # [T, E]
        weights, ids = torch.topk(probs, self.top_k, dim=-1)  # [T, k]
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return self.runner.apply(x, self.w13, self.w2, weights, ids)
