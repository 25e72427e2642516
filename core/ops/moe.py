"""MoE expert runner interface.

Weights (stacked per expert, on the MoE layer): w13 [E, 2*I, D] (gate rows then up rows) and
w2 [E, D, I]. The runner computes
    out[t] = sum_j topk_weights[t, j] * w2[e] @ (silu(gate_e x_t) * up_e x_t),  e = topk_ids[t, j]

Routing (optional hook): the MoE layer (core/model/layers/moe.py) asks its runner for the
(weights, ids) of every token through ``MoERunner.select_experts``. The base class implements it
with the core's plain-torch routing, ``softmax_topk``; a runner overrides it to route on its
device's fused op (Ascend: ``npu_moe_gating_top_k_softmax``). An override keeps the contract of
``softmax_topk``: softmax over the experts, the ``top_k`` largest, optionally renormalised.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


def softmax_topk(router_logits: torch.Tensor, top_k: int,
                 renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The core's routing: router_logits [T, E] -> (weights float32 [T, k], ids [T, k] integer
    expert numbers): softmax over E in float32, the k largest, rescaled to sum to 1 when
    ``renormalize`` (Mixtral always, Qwen3-MoE with norm_topk_prob)."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


class MoERunner(ABC):
    name: str = ""

    def select_experts(self, router_logits: torch.Tensor, top_k: int,
                       renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Optional hook: route T tokens, router_logits [T, E] -> (weights float32 [T, k], ids
        integer [T, k]), the contract of ``softmax_topk`` (which this default runs). Override it
        to route on a device op; ids may be int32 or int64."""
        return softmax_topk(router_logits, top_k, renormalize)

    @abstractmethod
    def apply(self, hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """hidden [T, D], topk_weights [T, k] float, topk_ids [T, k] int -> [T, D]."""
