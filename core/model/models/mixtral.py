"""MixtralForCausalLM: the Llama graph with a sparse MoE block instead of the MLP.

    router: p = softmax(x W_g^T) [T, E] (float32), top-k experts, weights renormalised to sum 1
    experts (checkpoint w1 = gate, w3 = up, w2 = down) stacked into w13 [E, 2I, D], w2 [E, D, I]
Checkpoint names: ``model.layers.i.block_sparse_moe.{gate, experts.e.w1/w2/w3}``.
"""

from __future__ import annotations

from typing import Any

from infer.core.model.layers.moe import SparseMoE
from infer.core.model.models.llama import DecoderLayer, LlamaForCausalLM
from torch import nn


class MixtralDecoderLayer(DecoderLayer):
    """The MoE block lives under ``block_sparse_moe`` (the checkpoint's name), not ``mlp``."""

    def __init__(self, attn: nn.Module, moe: SparseMoE, hidden_size: int, eps: float,
                 dtype: Any, ops: Any = None) -> None:
        super().__init__(attn, moe, hidden_size, eps, dtype, ops)
        del self.mlp
        self.block_sparse_moe = moe

    @property
    def moe(self) -> SparseMoE:
        return self.block_sparse_moe

    def forward(self, positions: Any, h: Any, fwd: Any) -> Any:
        a = self.self_attn(positions, self.input_layernorm(h), fwd)  # [T, hidden]
        x, h = self.post_attention_layernorm(a, h)
        return self._add(h, self.block_sparse_moe(x))


class MixtralForCausalLM(LlamaForCausalLM):
    def make_layer(self, config: Any, ctx: Any, layer_id: int) -> nn.Module:
        moe = SparseMoE(self.hidden_size, config.intermediate_size, config.num_local_experts,
                        config.num_experts_per_tok, renormalize=True, ctx=ctx)
        return MixtralDecoderLayer(self.make_attention(config, ctx, layer_id), moe,
                                   self.hidden_size, config.rms_norm_eps, ctx.dtype, ctx.ops)
