"""Helpers for end-to-end GPU tests: tiny random checkpoints and greedy generation via EngineCore."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import torch


def make_tiny_checkpoint(directory: Path, arch: str = "llama", seed: int = 0,
                         initializer_range: float = 0.3) -> Path:
    """A random fp32 checkpoint (config + safetensors, no tokenizer). head_dim 64 so FlashInfer
    can run it too. ``initializer_range`` is the weights' std: 0.3 gives peaked logits (greedy
    tokens well separated), smaller values a better-conditioned model (small errors stay small)."""
    import transformers as tf

    common = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  initializer_range=initializer_range, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
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
           inspect: Any = None, **settings: Any) -> list[list[int]]:
    """Greedy continuations (EOS ignored) of every prompt, all submitted at once. ``inspect``,
    when given, is called with the EngineCore before the requests run.

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
        if inspect is not None:
            inspect(core)
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


def load(model_dir: Path, device: str = "cuda", host: Any = None, **settings: Any) -> Any:
    """``load_model`` on ``device``'s platform without the start-up gate (as ``greedy`` does);
    ``host`` defaults to the installed plugins."""
    from infer.core.model.loader import load_model
    from infer.core.plugins import get_plugin_host

    host = host or get_plugin_host()
    settings.setdefault("skip_tokenizer_init", True)
    return load_model(str(model_dir), platform=host.select(device), host=host, progress=False,
                      **settings)


def teacher_forced_logits(loaded: Any, tokens: list[int], prefill_len: int) -> torch.Tensor:
    """One sequence through ``loaded.model`` with its own KV cache (``arch.kv_dtype``, page size
    1): a prefill of tokens[:prefill_len], then tokens[prefill_len:] one decode step each (the
    given tokens, not sampled ones). Returns float32 logits [len(tokens), V] on the CPU: row i
    predicts token i + 1 from tokens[:i + 1]; rows from prefill_len on come from decode steps
    that read every earlier token's k/v back from the cache."""
    from infer.core.ops.attention import AttentionMetadata, KVCache
    from infer.core.ops.forward_batch import ForwardBatch

    arch, dev, n = loaded.arch, loaded.ctx.device, len(tokens)
    shape = (n + 1, 1, arch.num_kv_heads, arch.head_dim)  # page p holds position p - 1; page 0 unused
    kv = KVCache(k=[torch.zeros(shape, dtype=arch.kv_dtype, device=dev) for _ in range(arch.num_layers)],
                 v=[torch.zeros(shape, dtype=arch.kv_dtype, device=dev) for _ in range(arch.num_layers)])
    table = torch.arange(1, n + 1, dtype=torch.int32, device=dev)[None, :]  # [1, n]
    rows, start = [], 0
    for end in [prefill_len, *range(prefill_len + 1, n + 1)]:
        ext = end - start
        meta = AttentionMetadata(
            num_seqs=1, num_tokens=ext, page_size=1,
            query_start_loc=torch.tensor([0, ext], dtype=torch.int32, device=dev),
            seq_lens=torch.tensor([end], dtype=torch.int32, device=dev),
            prefix_lens=torch.tensor([start], dtype=torch.int32, device=dev),
            block_tables=table, slot_mapping=torch.arange(start + 1, end + 1, device=dev),
            seq_lens_cpu=[end], extend_lens_cpu=[ext], max_seq_len=end, max_extend_len=ext)
        fwd = ForwardBatch(input_ids=torch.tensor(tokens[start:end], device=dev),
                           positions=torch.arange(start, end, device=dev), attn=meta,
                           logits_indices=torch.arange(ext, device=dev), kv_cache=kv)
        loaded.ctx.attn_backend.plan(meta)
        with torch.no_grad():
            rows.append(loaded.model(fwd).float().cpu())  # [ext, V]
        start = end
    return torch.cat(rows)
