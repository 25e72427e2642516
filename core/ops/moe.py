"""MoE expert runner interface.

Weights (stacked per expert, on the MoE layer): w13 [E, 2*I, D] (gate rows then up rows) and
w2 [E, D, I]. Routing is done by the layer; the runner computes
    out[t] = sum_j topk_weights[t, j] * w2[e] @ (silu(gate_e x_t) * up_e x_t),  e = topk_ids[t, j]
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class MoERunner(ABC):
    name: str = ""

    @abstractmethod
    def apply(self, hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """hidden [T, D], topk_weights [T, k] float, topk_ids [T, k] int -> [T, D]."""
