"""MoE expert runner interface.

Weights (stacked per expert, on the MoE layer): w13 [E, 2*I, D] (gate rows then up rows) and
w2 [E, D, I]. The runner computes
    out[t] = sum_j topk_weights[t, j] * w2[e] @ (silu(gate_e x_t) * up_e x_t),  e = topk_ids[t, j]

Routing (optional hook): the MoE layer (core/model/layers/moe.py) asks its runner for the
(weights, ids) of every token through ``MoERunner.select_experts``. The base class implements it
with the core's plain-torch routing, ``softmax_topk``; a runner overrides it to route on its
device's fused op (Ascend: ``npu_moe_gating_top_k_softmax``). An override keeps the contract of
``softmax_topk``: softmax over the experts, the ``top_k`` largest, optionally renormalised.

Expert-parallel dispatch (optional hooks, ep > 1): by default the layer dispatches itself (each
rank runs its experts' share of the tokens through ``apply`` and the partial outputs are summed
by an all-reduce, or a reduce-scatter for rank-local tokens). A runner that moves tokens between
ranks on its own (Ascend's MC2 ``npu_moe_distribute_dispatch`` / ``_combine``) answers
``dispatches(layer, tokens_per_rank)`` with True for the layers and batch sizes it takes; the
layer then hands each rank an equal share of the tokens (zero-padded to ``tokens_per_rank``,
routed by ``select_experts``) to ``dispatch_combine`` and only all-gathers the results. The answer
must be the same on every rank (it may depend on the layer and ``tokens_per_rank`` only).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

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

    def dispatches(self, layer: Any, tokens_per_rank: int) -> bool:
        """Optional hook: True when ``dispatch_combine`` takes over the expert-parallel dispatch
        and combine of ``layer`` (a core SparseMoE with ep_size > 1) for batches of
        ``tokens_per_rank`` tokens on every rank. Default: False (the layer dispatches)."""
        return False

    def dispatch_combine(self, layer: Any, hidden: torch.Tensor, topk_weights: torch.Tensor,
                         topk_ids: torch.Tensor) -> torch.Tensor:
        """Optional hook, called only where ``dispatches`` said True: hidden [T_r, D] this rank's
        tokens, topk_* [T_r, k] with global expert ids -> [T_r, D], the MoE output of these
        tokens over every rank's experts (no further reduction by the layer)."""
        raise NotImplementedError(f"MoE runner {self.name!r} does not dispatch across ranks")

    @abstractmethod
    def apply(self, hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """hidden [T, D], topk_weights [T, k] float, topk_ids [T, k] int -> [T, D]."""
