"""Qwen3MoeForCausalLM: the Qwen3 graph (q/k norm) with sparse MoE MLPs.

    router: p = softmax(x W_g^T) [T, E] (float32), top-k; renormalised iff config.norm_topk_prob
    layer i is sparse when i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0,
    else a dense gated MLP of config.intermediate_size.
Checkpoint names: ``model.layers.i.mlp.{gate, experts.e.gate_proj/up_proj/down_proj}``.
"""

from __future__ import annotations

from typing import Any

from infer.core.model.layers.mlp import GatedMLP
from infer.core.model.layers.moe import SparseMoE
from infer.core.model.models.qwen3 import Qwen3ForCausalLM
from torch import nn


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def make_mlp(self, config: Any, ctx: Any, layer_id: int) -> nn.Module:
        step = getattr(config, "decoder_sparse_step", 1) or 1
        sparse = (layer_id not in (getattr(config, "mlp_only_layers", None) or [])
                  and config.num_experts > 0 and (layer_id + 1) % step == 0)
        if not sparse:
            return GatedMLP(self.hidden_size, config.intermediate_size, ctx)
        return SparseMoE(self.hidden_size, config.moe_intermediate_size, config.num_experts,
                         config.num_experts_per_tok, renormalize=bool(config.norm_topk_prob),
                         ctx=ctx)
