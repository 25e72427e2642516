"""Self-attention over the paged KV cache through the context's attention backend.

``DecoderAttention`` = fused QKV projection -> optional per-head q/k RMSNorm (Qwen3) -> rotary ->
backend (writes this layer's new k/v into the cache, attends over prefix + new tokens) -> o_proj.
Every attention layer of a model shares ``ctx.attn_backend``; the model runner plans it per batch.
With tensor parallelism a rank holds H/tp query heads and its KV head(s) (``layers.shard``).
A backend with ``fuses_rotary`` gets q and k unrotated plus the rotary table and applies it in its
own cache-write kernel (one launch instead of three on CUDA).
"""

from __future__ import annotations

from typing import Any

import torch
from infer.core.model.layers.linear import QKVParallelLinear, RowParallelLinear
from infer.core.model.layers.norm import RMSNorm
from infer.core.model.layers.rotary import RotaryEmbedding
from infer.core.model.layers.shard import kv_head_slice
from infer.core.ops.attention import RotaryArgs
from infer.core.ops.forward_batch import ForwardBatch
from torch import nn


class DecoderAttention(nn.Module):
    def __init__(self, *, layer_id: int, hidden_size: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, rotary: RotaryEmbedding, ctx: Any, qkv_bias: bool = False,
                 qk_norm_eps: float | None = None) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.ctx = ctx
        self.num_heads = num_heads // ctx.tp_size  # this rank's query heads
        self.num_kv_heads = kv_head_slice(num_kv_heads, ctx.tp_size, ctx.tp_rank).size
        self.head_dim = head_dim
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self.qkv_proj = QKVParallelLinear(hidden_size, head_dim, num_heads, num_kv_heads,
                                          bias=qkv_bias, ctx=ctx)
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden_size, bias=False, ctx=ctx)
        self.rotary = rotary
        self.q_norm = self.k_norm = None
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps, ctx.dtype, ctx.ops)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps, ctx.dtype, ctx.ops)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, fwd: ForwardBatch) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(t, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.reshape(t, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        i, backend = self.layer_id, self.ctx.attn_backend
        if backend.fuses_rotary:
            rot = RotaryArgs(positions, self.rotary.cos_sin, self.rotary.rotary_dim)
            o = backend.forward(q, k, v, fwd.kv_cache.k[i], fwd.kv_cache.v[i], i, rotary=rot)
        else:
            q, k = self.rotary(positions, q, k)
            o = backend.forward(q, k, v, fwd.kv_cache.k[i], fwd.kv_cache.v[i], i)
        return self.o_proj(o.reshape(t, self.q_size))  # [T, hidden]
