"""Tiny random Hugging Face checkpoints, one per supported architecture (fp32 safetensors)."""

from __future__ import annotations

from pathlib import Path

import torch

COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              initializer_range=0.3, rms_norm_eps=1e-5)


def tiny_config(arch: str, **overrides):
    import transformers as tf

    if arch == "llama":
        cfg = tf.LlamaConfig(**COMMON, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                             "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64})
    elif arch == "llama_tied":
        cfg = tf.LlamaConfig(**COMMON, tie_word_embeddings=True)
    elif arch == "mistral":
        cfg = tf.MistralConfig(**COMMON, sliding_window=None)
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(**COMMON, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                             "factor": 4.0, "original_max_position_embeddings": 64})
    elif arch == "qwen3":
        cfg = tf.Qwen3Config(**COMMON, head_dim=32)
    elif arch == "mixtral":
        cfg = tf.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2,
                               sliding_window=None)
    elif arch == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(**COMMON, head_dim=16, num_experts=6, num_experts_per_tok=2,
                                moe_intermediate_size=32, norm_topk_prob=True,
                                decoder_sparse_step=2, mlp_only_layers=[])
    else:
        raise KeyError(arch)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def save_tiny(arch: str, directory: Path, seed: int = 0, dtype=torch.float32, **overrides):
    """Save a random model of ``arch`` to ``directory``; returns the transformers model (eval)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(arch, **overrides)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    model.save_pretrained(directory)
    return model
