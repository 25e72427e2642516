"""ForwardBatch: the tensors of one model step. Only the model runner builds it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from infer.core.ops.attention import AttentionMetadata, KVCache


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64, new tokens of every sequence, packed in sequence order
    positions: torch.Tensor  # [T] int64, absolute position of each new token
    attn: AttentionMetadata
    logits_indices: torch.Tensor  # [N] int64 rows of the packed tokens whose logits are wanted
    kv_cache: KVCache  # the model runner's caches; layer i reads kv_cache.k[i], kv_cache.v[i]
    # every logit row is a plain greedy sample: a graph runner may return their argmax ids
    # ([N] int64, exactly logits.argmax(-1)) instead of the logits
    greedy_ids: bool = False

    @property
    def num_tokens(self) -> int:
        return self.attn.num_tokens
