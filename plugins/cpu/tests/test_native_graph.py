"""The CPU graph runner (infer_cpu.graph): the whole decode stack in one native call must give
the same tokens as the per-op path (the same kernels, called from Python), and models it cannot
run are left to the per-op path with the reason."""

from __future__ import annotations

import pytest
from infer_cpu import kernels

pytestmark = pytest.mark.skipif(kernels.load() is None,
                                reason=f"native kernels unavailable: {kernels.status().detail}")


@pytest.mark.slow
@pytest.mark.parametrize(("flags", "kv16"), [
    ({}, 2),  # auto: the fp16 cache the CPU gives a GGUF file
    ({"kv_cache_dtype": "bf16"}, 1),
    ({"dtype": "float32", "quantization": "gguf"}, 0)])  # the float32 cache
def test_graph_matches_per_op_path_on_the_default_model(greedy, flags, kv16, monkeypatch):
    """With the fp16 cache (auto), a bf16 one and a float32 one (the graph's attention reads each
    as stored); with the auto cache, the per-op path also without the projections' packed tiles
    (``INFER_CPU_PACKED_TILES=0``: the GEMM repacks the blocks on every call), which must not
    change an answer either (the tiles belong to the projections, not to the cache: checked for
    one cache type only, so the other two build two engines each, not three: CI's time)."""
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore
    from infer.core.model.loader.default_model import ensure_default_model

    path = str(ensure_default_model(quiet=True))
    # five sequences, two of which stop early: decode batches of 5, 4 and 3 rows cover both the
    # shared (4+ rows) and the per-thread activation quantization of the graph
    prompts = [list(range(200, 240)), list(range(300, 307)), list(range(500, 519)),
               list(range(700, 712)), list(range(900, 933))]
    counts = [16, 16, 16, 9, 5]
    graph = EngineCore(ServerArgs(model_path=path, page_size=4, chunked_prefill_size=32, **flags))
    runner = graph.runner.graph_runner
    assert runner is not None and runner.ok, getattr(runner, "reason", None)
    assert runner.kv16 == kv16
    qkv = runner._keep[1][0].qweight  # layer 0's qkv projection
    packs = kernels._lib().infer_tiles_bytes(qkv.kind, qkv.out_features, qkv.in_features) > 0
    assert (qkv.tiles is not None) == packs and bool(runner.table[0].tqkv) == packs
    calls = {"n": 0}
    run = runner.run

    def counted(batch):
        calls["n"] += 1
        return run(batch)

    runner.run = counted
    got = greedy(graph, prompts, counts)
    assert calls["n"] >= 15  # the decode steps went through the graph
    import torch

    if torch.get_num_threads() > 1:  # steps ran on 1 thread and on all (ThreadChoice measures both)
        assert {t for (_, t) in runner.threads._avg} == {1, torch.get_num_threads()}
    kinds = {"prefill": 0, "mixed": 0}

    def counted_kinds(batch):
        ext = batch.attn.extend_lens_cpu
        if any(e > 1 for e in ext):
            kinds["mixed" if any(e == 1 for e in ext) else "prefill"] += 1
        return run(batch)

    runner.run = counted_kinds
    staggered = _staggered(graph)
    assert kinds["prefill"] >= 1 and kinds["mixed"] >= 1  # prefill and mixed steps, natively
    del graph
    eager = EngineCore(ServerArgs(model_path=path, page_size=4, disable_cuda_graph=True,
                                  chunked_prefill_size=32, **flags))
    assert eager.runner.graph_runner is None
    assert greedy(eager, prompts, counts) == got
    assert _staggered(eager) == staggered
    del eager
    if flags:
        return
    monkeypatch.setenv("INFER_CPU_PACKED_TILES", "0")
    repacked = EngineCore(ServerArgs(model_path=path, page_size=4, disable_cuda_graph=True,
                                     chunked_prefill_size=32, **flags))
    assert repacked.runner.model.model.layers[0].self_attn.qkv_proj.qweight.tiles is None
    assert greedy(repacked, prompts, counts) == got


def _staggered(core) -> dict[str, list[int]]:
    """Greedy requests that arrive while others decode: steps mixing a prompt's rows with
    decode rows (the CPU's mixed chunks), prompts longer than the test's 32-token chunks."""
    params = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}
    arrivals = {0: [list(range(100, 130))], 2: [list(range(40, 45)), list(range(800, 860))],
                4: [list(range(1200, 1203))]}
    outs: dict[str, list[int]] = {}
    step = 0
    while step in arrivals or core.has_work():
        for i, p in enumerate(arrivals.get(step, [])):
            core.add_request(core.make_request(f"s{step}.{i}", p, dict(params)))
        for o in core.step():
            outs.setdefault(o.rid, []).extend(o.new_token_ids)
        step += 1
    return outs


def test_dense_model_is_left_to_the_per_op_path(tmp_path, greedy):
    import sys
    from pathlib import Path

    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore

    sys.path.insert(0, str(Path(__file__).parents[3] / "tests" / "server"))
    from tiny_model import make_tiny_llama  # a tiny random Llama with a real tokenizer

    make_tiny_llama(tmp_path)
    core = EngineCore(ServerArgs(model_path=str(tmp_path), dtype="float32",
                                 max_total_tokens=512))
    runner = core.runner.graph_runner
    assert runner is not None and not runner.ok
    assert "dense linear layer" in runner.reason
    assert len(greedy(core, [[1, 2, 3]], 4)[0]) == 4
