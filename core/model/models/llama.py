"""LlamaForCausalLM: Llama 2/3/3.1/3.2, SmolLM2 and Mistral (dense).

Per layer (pre-norm residual):
    h = h + o_proj(attn(rope(q), rope(k), v))     q [T, H, D], k/v [T, Hkv, D] (GQA)
    h = h + down(silu(gate(norm h)) * up(norm h))
Optional knobs used by the subclasses: ``qkv_bias`` (Qwen2) and ``qk_norm`` (Qwen3).
"""

from __future__ import annotations

from typing import Any

import torch
from infer.core.model.layers.attention import DecoderAttention
from infer.core.model.layers.mlp import GatedMLP
from infer.core.model.layers.norm import RMSNorm
from infer.core.model.models.base import DecoderOnlyLM
from infer.core.ops.forward_batch import ForwardBatch
from infer.core.ops.layer_ops import REFERENCE_OPS, LayerOps
from torch import nn


class DecoderLayer(nn.Module):
    def __init__(self, attn: DecoderAttention, mlp: nn.Module, hidden_size: int, eps: float,
                 dtype: torch.dtype, ops: LayerOps | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden_size, eps, dtype, ops)
        self.self_attn = attn
        self.post_attention_layernorm = RMSNorm(hidden_size, eps, dtype, ops)
        self.mlp = mlp
        self._add = (ops or REFERENCE_OPS).residual_add

    def forward(self, positions: torch.Tensor, h: torch.Tensor, fwd: ForwardBatch) -> torch.Tensor:
        a = self.self_attn(positions, self.input_layernorm(h), fwd)  # [T, hidden]
        x, h = self.post_attention_layernorm(a, h)  # h <- h + a; x = norm(h)
        return self._add(h, self.mlp(x))


class LlamaForCausalLM(DecoderOnlyLM):
    qkv_bias: bool | None = None  # None: read config.attention_bias
    qk_norm = False

    def make_attention(self, config: Any, ctx: Any, layer_id: int) -> DecoderAttention:
        bias = self.qkv_bias if self.qkv_bias is not None else getattr(config, "attention_bias", False)
        return DecoderAttention(
            layer_id=layer_id, hidden_size=self.hidden_size, num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, rotary=self.rotary, ctx=ctx,
            qkv_bias=bool(bias), qk_norm_eps=config.rms_norm_eps if self.qk_norm else None)

    def make_mlp(self, config: Any, ctx: Any, layer_id: int) -> nn.Module:
        return GatedMLP(self.hidden_size, config.intermediate_size, ctx,
                        bias=bool(getattr(config, "mlp_bias", False)))

    def make_layer(self, config: Any, ctx: Any, layer_id: int) -> nn.Module:
        return DecoderLayer(self.make_attention(config, ctx, layer_id),
                            self.make_mlp(config, ctx, layer_id), self.hidden_size,
                            config.rms_norm_eps, ctx.dtype, ctx.ops)


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral dense checkpoints: the Llama graph (sliding window unsupported, see the loader)."""
