"""Qwen2ForCausalLM: the Llama graph with biases on the q/k/v projections.

    qkv = x W_qkv^T + b_qkv    [T, (H + 2 Hkv) * D]
Sliding-window layers are not implemented; the loader caps the context at the window when a
config enables it, where full attention is exact.
"""

from __future__ import annotations

from infer.core.model.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
