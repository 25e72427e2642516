"""Helpers for end-to-end GPU tests: tiny random checkpoints and greedy generation via EngineCore."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import torch


def make_tiny_checkpoint(directory: Path, arch: str = "llama", seed: int = 0) -> Path:
    """A random fp32 checkpoint (config + safetensors, no tokenizer). head_dim 64 so FlashInfer
    can run it too."""
    import transformers as tf

    common = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  initializer_range=0.3, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                  tie_word_embeddings=False)
    torch.manual_seed(seed)
    if arch == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**common))
    else:
        model = tf.MixtralForCausalLM(tf.MixtralConfig(**common, num_local_experts=4,
                                                       num_experts_per_tok=2))
    model.eval().save_pretrained(directory)
    return directory


def greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int, device: str = "cuda",
           **settings: Any) -> list[list[int]]:
    """Greedy continuations (EOS ignored) of every prompt, all submitted at once.

    The platform is selected directly (the start-up gate has its own tests), so settings the
    core matrix has not listed yet (e.g. --skip-tokenizer-init) do not stop a kernel test."""
    from infer.core.config import ServerArgs
    from infer.core.config.gate import apply_platform_defaults
    from infer.core.engine.engine_core import EngineCore
    from infer.core.plugins import get_plugin_host

    args = ServerArgs(model_path=str(model_dir), device=device, skip_tokenizer_init=True,
                      max_total_tokens=8192, random_seed=0, **settings)
    platform = get_plugin_host().select(device)
    apply_platform_defaults(args, platform)
    core = EngineCore(args, platform=platform)
    try:
        params = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}
        out: dict[str, list[int]] = {}
        for i, p in enumerate(prompts):
            core.add_request(core.make_request(str(i), p, params))
            out[str(i)] = []
        while core.has_work():
            for o in core.step():
                out[o.rid] += o.new_token_ids
        return [out[str(i)] for i in range(len(prompts))]
    finally:
        del core
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def random_prompts(lengths: list[int], vocab: int = 512, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
