"""Graph runners: capture, then replay of decode batches, against the same batches run eagerly.

The kit builds an engine for a tiny random Llama (``load_format="dummy"``, no tokenizer) on the
platform with graphs off, so its model runner runs every step eagerly; then it builds the graph
runner under test around that model runner (``factory(model_runner, graph_config)``, graphs on),
captures, fills the KV cache with random values (the cached prefixes) and, for decode batches of
several sizes (sizes between captured ones exercise padding), compares the logits of
``run(batch)`` with the eager forward's, and the KV cache each left behind outside the scratch
page 0 (where padding rows write their keys and values by design). A runner whose
``can_run`` declines every batch is reported as refused, with its ``reason`` if it has one.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from infer.core.testing.batches import rel_err
from infer.core.testing.outcome import ConformanceFailure, OpRefused, Outcome, Tolerances, build

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
}
BATCH_SIZES = (1, 2, 3, 5, 8)
PAGE_SIZE = 16


def check_graph_runner(name: str, factory: Any, platform: Any, dtypes: tuple[torch.dtype, ...],
                       tol: Tolerances, seed: int = 0) -> Outcome:
    outcome = Outcome(f"graph runner {name!r}")
    for dtype in dtypes:
        with outcome.case(str(dtype)[6:]), tempfile.TemporaryDirectory() as tmp:
            _run_dtype(factory, platform, dtype, Path(tmp), tol, seed)
    return outcome.raise_if_failed(every_refusal_fails=False)  # declining a model is allowed


def _engine(platform: Any, dtype: torch.dtype, model_dir: Path) -> Any:
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore

    (model_dir / "config.json").write_text(json.dumps(TINY_LLAMA))
    args = ServerArgs(model_path=str(model_dir), load_format="dummy", skip_tokenizer_init=True,
                      dtype=str(dtype)[6:], page_size=PAGE_SIZE, disable_cuda_graph=True,
                      max_total_tokens=4096, max_running_requests=max(BATCH_SIZES),
                      cuda_graph_max_bs=max(BATCH_SIZES))
    return EngineCore(args, platform=platform)


@torch.inference_mode()
def _run_dtype(factory: Any, platform: Any, dtype: torch.dtype, model_dir: Path, tol: Tolerances,
               seed: int) -> None:
    from infer.core.engine.model_runner import DecodeInputs

    core = _engine(platform, dtype, model_dir)
    mr = core.runner
    graph = build(factory, mr, dataclasses.replace(core.cfg.graph, disable=False))
    graph.capture()
    gen = torch.Generator().manual_seed(seed)
    for cache in (*mr.kv_cache.k, *mr.kv_cache.v):
        cache.copy_(torch.randn(cache.shape, generator=gen).to(cache.dtype))
    free = (torch.randperm(mr.num_pages - 1, generator=gen) + 1).tolist()  # page 0: scratch
    ran, errors = [], []
    for bs in BATCH_SIZES:
        seq_lens = torch.randint(1, 5 * PAGE_SIZE, (bs,), generator=gen).tolist()
        tables = [[free.pop() for _ in range(-(-s // PAGE_SIZE))] for s in seq_lens]
        slots = [t[(s - 1) // PAGE_SIZE] * PAGE_SIZE + (s - 1) % PAGE_SIZE
                 for t, s in zip(tables, seq_lens, strict=True)]
        ids = torch.randint(0, TINY_LLAMA["vocab_size"], (bs,), generator=gen).tolist()
        inputs = DecodeInputs(ids, [s - 1 for s in seq_lens], seq_lens, tables, slots)
        before = [c.clone() for c in (*mr.kv_cache.k, *mr.kv_cache.v)]
        fwd = mr.build_forward_batch(inputs)
        if not graph.can_run(fwd):
            continue
        mr.attn_backend.plan(fwd.attn)
        eager = mr.model(fwd).float()  # [bs, vocab]
        eager_caches = [c.clone() for c in (*mr.kv_cache.k, *mr.kv_cache.v)]
        for cache, old in zip((*mr.kv_cache.k, *mr.kv_cache.v), before, strict=True):
            cache.copy_(old)
        replayed = graph.run(mr.build_forward_batch(inputs)).float()
        ran.append(bs)
        err = rel_err(replayed, eager) if replayed.shape == eager.shape else float("inf")
        if not err <= tol.for_dtype(dtype):
            errors.append(f"batch {bs}: logits {tuple(replayed.shape)} vs eager "
                          f"{tuple(eager.shape)}, relative error {err:.3g}")
        # pages 1..: padding rows write the scratch page 0 (the page pool never hands it out)
        caches_err = max(rel_err(c[1:], e[1:]) for c, e in zip((*mr.kv_cache.k, *mr.kv_cache.v),
                                                               eager_caches, strict=True))
        if not caches_err <= tol.for_dtype(dtype):
            errors.append(f"batch {bs}: KV cache after replay differs from the eager step's "
                          f"(relative error {caches_err:.3g})")
    if errors:
        raise ConformanceFailure("; ".join(errors))
    if not ran:
        reason = getattr(graph, "reason", None)
        raise OpRefused(f"can_run declined every decode batch ({', '.join(map(str, BATCH_SIZES))})"
                        + (f": {reason}" if reason else ""))
