"""Qwen3ForCausalLM: the Llama graph with per-head RMSNorm on q and k before rotary.

    q [T, H, D] -> q_norm(q) (over D) -> rope;  k [T, Hkv, D] -> k_norm(k) -> rope
Biases follow ``config.attention_bias`` (off in released checkpoints); head_dim comes from the
config (128 in released checkpoints, not hidden / heads).
"""

from __future__ import annotations

from infer.core.model.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
