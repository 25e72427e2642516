"""Token embedding and LM head (tied or not), vocabulary-parallel across tensor-parallel ranks.

Rank r holds vocabulary rows [r*P, r*P + P) with P = ceil(V / tp) (``layers.shard.vocab_slice``;
rows past V are zero padding). The embedding looks up the tokens in its range, zeroes the
others and all-reduces [T, hidden]; the LM head computes logits for its rows [N, P] and
all-gathers them into [N, V]. With one rank both are the plain lookup / matmul.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from infer.core.model.layers.shard import vocab_slice
from infer.core.model.loader.weights import materialize
from torch import nn


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, ctx: Any) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.tp_size = getattr(ctx, "tp_size", 1)
        self.rows, per_rank = vocab_slice(vocab_size, self.tp_size, getattr(ctx, "tp_rank", 0))
        self.comm = getattr(ctx, "comm", None)
        self.weight = nn.Parameter(torch.empty(per_rank, hidden_size, dtype=ctx.dtype,
                                               device=ctx.device), requires_grad=False)

    def load(self, param: str, loaded: Any, shard: Any = None) -> None:
        """This rank's rows of the full checkpoint weight [V, hidden]; padding rows zeroed."""
        if loaded.shape != (self.vocab_size, self.weight.shape[1]):
            raise ValueError(f"embedding shape mismatch: checkpoint {tuple(loaded.shape)}, model "
                             f"({self.vocab_size}, {self.weight.shape[1]})")
        part = materialize(loaded.narrow(0, self.rows.start, self.rows.size))
        self.weight.data[:self.rows.size].copy_(part)
        self.weight.data[self.rows.size:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)  # [T] -> [T, hidden]
        local = input_ids - self.rows.start
        inside = (local >= 0) & (local < self.rows.size)  # [T]
        out = F.embedding(torch.where(inside, local, 0), self.weight)
        return self.comm.all_reduce(out.masked_fill_(~inside[:, None], 0))  # [T, hidden]


class LMHead(nn.Module):
    """logits = hidden @ weight^T in float32; ``tie_to`` shares the embedding's weight (shard)."""

    def __init__(self, vocab_size: int, hidden_size: int, ctx: Any,
                 tie_to: VocabEmbedding | None = None) -> None:
        super().__init__()
        self.tied = tie_to is not None
        self.vocab_size = vocab_size
        self.tp_size = getattr(ctx, "tp_size", 1)
        self.rows, per_rank = vocab_slice(vocab_size, self.tp_size, getattr(ctx, "tp_rank", 0))
        self.comm = getattr(ctx, "comm", None)
        if tie_to is not None:
            self.weight = tie_to.weight
        else:
            self.weight = nn.Parameter(torch.empty(per_rank, hidden_size, dtype=ctx.dtype,
                                                   device=ctx.device), requires_grad=False)

        # a linear method's optional ``process_lm_head(lm_head)`` may set this to a repacked
        # (e.g. int8) matmul of this rank's rows: hidden [N, hidden] -> logits [N, P]
        self.quant_apply: Any = None

    load = VocabEmbedding.load

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> float32 logits [N, vocab]."""
        if self.quant_apply is not None:
            logits = self.quant_apply(hidden).float()
        else:
            logits = F.linear(hidden, self.weight).float()  # [N, P]
        if self.tp_size == 1:
            return logits
        return self.comm.all_gather(logits, dim=-1)[:, :self.vocab_size]  # [N, V]
