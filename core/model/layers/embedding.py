"""Token embedding and LM head (tied or not)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, ctx: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=ctx.dtype,
                                               device=ctx.device), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)  # [T] -> [T, hidden]


class LMHead(nn.Module):
    """logits = hidden @ weight^T in float32; ``tie_to`` shares the embedding's weight."""

    def __init__(self, vocab_size: int, hidden_size: int, ctx: Any,
                 tie_to: VocabEmbedding | None = None) -> None:
        super().__init__()
        self.tied = tie_to is not None
        if tie_to is not None:
            self.weight = tie_to.weight
        else:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=ctx.dtype,
                                                   device=ctx.device), requires_grad=False)

        # a linear method's optional ``process_lm_head(lm_head)`` may set this to a repacked
        # (e.g. int8) matmul: hidden [N, hidden] -> logits [N, vocab]
        self.quant_apply: Any = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.quant_apply is not None:
            return self.quant_apply(hidden).float()
        return F.linear(hidden, self.weight).float()  # [N, hidden] -> [N, vocab]
