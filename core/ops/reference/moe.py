"""``torch`` MoE runner: tokens grouped by expert, one pair of GEMMs per expert that got any.

Reference semantics (see infer.core.ops.moe): for token t and its k chosen experts,
``out[t] = sum_j w[t, j] * w2[e] @ (silu(gate_e x_t) * up_e x_t)`` with w13 rows [gate; up].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from infer.core.ops.moe import MoERunner


class TorchMoERunner(MoERunner):
    name = "torch"

    def apply(self, hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """hidden [T, D], w13 [E, 2I, D], w2 [E, D, I], topk_* [T, k] -> [T, D]."""
        num_experts, k = w13.shape[0], topk_ids.shape[1]
        flat_ids = topk_ids.reshape(-1)  # [T*k]
        order = torch.argsort(flat_ids, stable=True)  # assignments grouped by expert
        counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
        token_of = order // k  # [T*k] token row of each sorted assignment
        weight_of = topk_weights.reshape(-1)[order]  # [T*k]
        out = torch.zeros_like(hidden)
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            rows = token_of[start:start + n]
            gate, up = F.linear(hidden[rows], w13[e]).chunk(2, dim=-1)  # [n, I] each
            y = F.linear(F.silu(gate) * up, w2[e])  # [n, D]
            y = y * weight_of[start:start + n, None]
            out.index_add_(0, rows, y.to(out.dtype))
            start += n
        return out
