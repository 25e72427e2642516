"""Extend (prefill) CUDA graphs end to end on a GPU: greedy tokens of a tiny fp32 Llama identical
with --enable-piecewise-cuda-graph on and off (prompt lengths between buckets, a cached prefix,
chunked prefill, torch.compile decode graphs beside them), and the graphs really replayed.
Skipped without a GPU.

Requests are admitted one per prefill batch (``prefill_max_requests=1``) so that every prefill is
a one-sequence extend batch, the kind the extend graphs cover; ``waves`` run one after another in
one engine so that a later wave finds the earlier prompts in the prefix cache."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_utils import make_tiny_checkpoint, random_prompts
from kernel_utils import INTERPRET

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET,
                       reason="needs a CUDA GPU (and TRITON_INTERPRET unset)"),
]

NEW = 16
BASE = dict(dtype="float32", attention_backend="triton", prefill_max_requests=1)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama_ext"), "llama")


def run_waves(model_dir: Path, waves: list[list[list[int]]], max_new_tokens: int,
              **settings: Any) -> tuple[list[list[int]], dict[str, int], int, list[int]]:
    """Greedy continuations (EOS ignored) of every prompt, wave after wave in one engine.

    Returns (tokens per prompt in order, the graph runner's replay counts (empty without one),
    prompt tokens served from the prefix cache, the captured extend buckets)."""
    from infer.core.config import ServerArgs
    from infer.core.config.gate import apply_platform_defaults
    from infer.core.engine.engine_core import EngineCore
    from infer.core.plugins import get_plugin_host

    args = ServerArgs(model_path=str(model_dir), device="cuda", skip_tokenizer_init=True,
                      max_total_tokens=8192, random_seed=0, **settings)
    platform = get_plugin_host().select("cuda")
    apply_platform_defaults(args, platform)
    core = EngineCore(args, platform=platform)
    try:
        params = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}
        out: dict[str, list[int]] = {}
        for w, prompts in enumerate(waves):
            for i, p in enumerate(prompts):
                rid = f"{w}.{i}"
                core.add_request(core.make_request(rid, p, params))
                out[rid] = []
            while core.has_work():
                for o in core.step():
                    out[o.rid] += o.new_token_ids
        gr = core.runner.graph_runner
        stats = dict(gr.stats) if gr is not None else {}
        buckets = sorted(gr.ext_graphs) if gr is not None else []
        return list(out.values()), stats, core.counters["cached_tokens"], buckets
    finally:
        del core
        gc.collect()
        torch.cuda.empty_cache()


def _waves(seed: int) -> list[list[list[int]]]:
    p5, p17, p40, p120 = random_prompts([5, 17, 40, 120], seed=seed)
    tail = random_prompts([9], seed=seed + 100)[0]
    return [[p5, p17, p40, p120], [p40[:32] + tail]]  # wave 2 shares 32 tokens with p40


def test_extend_graphs_match_eager(llama_dir):
    waves = _waves(seed=0)
    ref, ref_stats, ref_cached, _ = run_waves(llama_dir, waves, NEW, disable_cuda_graph=True, **BASE)
    ours, stats, cached, buckets = run_waves(
        llama_dir, waves, NEW, cuda_graph_max_bs=8, enable_piecewise_cuda_graph=True,
        piecewise_cuda_graph_tokens=[16, 32, 64], **BASE)
    assert ref_stats == {} and all(len(r) == NEW for r in ref)
    assert buckets == [16, 32, 64]
    assert ours == ref
    # prompts 5, 17, 40 and wave 2's uncached tail replayed extend graphs (120 > 64 ran eagerly)
    assert stats["extend"] >= 4, stats
    assert stats["extend_with_prefix"] >= 1 and cached > 0 and ref_cached == cached, stats
    assert stats["decode"] > 0


def test_chunked_prefill_extend_graphs_match_eager(llama_dir):
    """Chunks of 16: the default buckets clamp to [16]; chunks 2.. of a prompt extend a prefix."""
    waves = _waves(seed=1)
    ref, _, _, _ = run_waves(llama_dir, waves, NEW, disable_cuda_graph=True,
                             chunked_prefill_size=16, **BASE)
    ours, stats, cached, buckets = run_waves(llama_dir, waves, NEW, cuda_graph_max_bs=8,
                                             chunked_prefill_size=16,
                                             enable_piecewise_cuda_graph=True, **BASE)
    assert buckets == [16]
    assert ours == ref
    # every chunk is at most 16 tokens: 40 -> 16+16+8, 120 -> 8 chunks, 17 -> 16+1 (decode row)
    assert stats["extend"] >= 12 and stats["extend_with_prefix"] >= 9, stats
    assert cached > 0


def test_torch_compile_decode_graphs_beside_extend_graphs(llama_dir):
    waves = _waves(seed=2)
    ref, _, _, _ = run_waves(llama_dir, waves, NEW, disable_cuda_graph=True, **BASE)
    ours, stats, _, buckets = run_waves(
        llama_dir, waves, NEW, cuda_graph_bs=[8], enable_torch_compile=True, torch_compile_max_bs=8,
        enable_piecewise_cuda_graph=True, piecewise_cuda_graph_tokens=[16, 64], **BASE)
    assert buckets == [16, 64]
    assert ours == ref
    assert stats["extend"] >= 4 and stats["decode"] > 0, stats

