"""Overlap scheduling on a CUDA GPU (the default there): identical outputs to back-to-back steps
with CUDA graphs and eager, staggered arrivals, seeded sampling and stop tokens; no page leaks.
Skipped without a GPU (the CPU tests in tests/engine/test_overlap.py cover the same logic)."""

from __future__ import annotations

import gc

import pytest
import torch
from engine_utils import make_tiny_checkpoint, random_prompts
from kernel_utils import INTERPRET

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET,
                       reason="needs a CUDA GPU (and TRITON_INTERPRET unset)"),
]

LENGTHS = [7, 33, 1, 120, 64, 5, 18, 90]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama_overlap"), "llama")


def run(model_dir, overlap: bool | None, stops: dict[int, int] | None = None, **settings):
    """Outputs {rid: (ids, finish reason)} with one request added every second step; overlap
    None keeps the platform default."""
    from infer.core.config import ServerArgs
    from infer.core.config.gate import apply_platform_defaults
    from infer.core.engine.engine_core import EngineCore
    from infer.core.plugins import get_plugin_host

    if overlap is not None:
        settings["disable_overlap_schedule"] = not overlap
    args = ServerArgs(model_path=str(model_dir), device="cuda", skip_tokenizer_init=True,
                      max_total_tokens=4096, random_seed=0, dtype="float32",
                      attention_backend="triton", **settings)
    platform = get_plugin_host().select("cuda")
    apply_platform_defaults(args, platform)
    core = EngineCore(args, platform=platform)
    try:
        prompts = random_prompts(LENGTHS, seed=3)
        out: dict[str, list[int]] = {}
        reasons: dict[str, dict] = {}
        step = 0
        while step < 2 * len(prompts) or core.has_work():
            if step % 2 == 0 and step // 2 < len(prompts):
                i = step // 2
                params = {"max_new_tokens": 20, "temperature": 0.0, "ignore_eos": True}
                if i % 3 == 1:
                    params = {"max_new_tokens": 20, "temperature": 0.8, "top_p": 0.9, "seed": i,
                              "ignore_eos": True}
                if stops and i in stops:
                    params = {"max_new_tokens": 20, "temperature": 0.0, "stop_token_ids": [stops[i]]}
                core.add_request(core.make_request(f"r{i}", prompts[i], params))
            for o in core.step():
                out.setdefault(o.rid, []).extend(o.new_token_ids)
                if o.finished:
                    reasons[o.rid] = o.finish_reason
            step += 1
        s = core.stats()
        assert s.pages_free + s.pages_cached == s.pages_total and s.running == 0
        return {rid: (ids, reasons[rid]) for rid, ids in out.items()}, core.overlap
    finally:
        del core
        gc.collect()
        torch.cuda.empty_cache()


@pytest.mark.parametrize("graphs", [True, False])
def test_overlap_identical_to_plain(llama_dir, graphs):
    settings = {"cuda_graph_max_bs": 8} if graphs else {"disable_cuda_graph": True}
    plain, on = run(llama_dir, False, **settings)
    assert not on
    free = {int(k[1:]): ids for k, (ids, _) in plain.items()}
    stops = {i: free[i][4 + i % 5] for i in (0, 3, 5, 6)}  # greedy rows stop mid-way
    plain, _ = run(llama_dir, False, stops, **settings)
    over, on = run(llama_dir, None, stops, **settings)  # the CUDA platform's default
    assert on
    assert over == plain
    assert all(plain[f"r{i}"][1] == {"type": "stop", "matched": stops[i]} for i in stops)
