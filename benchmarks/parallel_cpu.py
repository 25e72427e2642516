"""Tensor parallelism on this CPU: tp=2 (two rank processes, one thread each) against tp=1 (one
process, two threads), decode at batch 1 and 32, alternating in one run.

    python benchmarks/parallel_cpu.py [--rounds 2] [--new-tokens 64] [--layers 30] [--float32]

The model is SmolLM2-135M-like with random weights (hidden 576 does not split over 9 heads at
tp=2, so heads are 8 x 64 here, 4 KV heads, hidden 512, intermediate 1536, vocabulary 49,152,
tied). By default it is a GGUF file with Q4_1 projections (Q8_0 down projection), the default
model's format, served by the CPU plugin's native kernels and its native decode graph (one native
call per decode step, the all-reduces inside it); ``--float32`` serves float32 safetensors-style
dummy weights on the per-op torch path instead. Per configuration it prints decode tokens/s,
whether the graph ran (and its all-reduce route), the time rank 0 spends in collectives per step
(all-reduce / all-gather, including waiting for the other rank; those made inside the native call
are timed by the C all-reduce itself), and the time to hand a step's inputs to the other ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

SHAPE = {"hidden": 512, "heads": 8, "kv_heads": 4, "inter": 1536, "vocab": 49152}


def make_model(d: Path, layers: int, float32: bool) -> Path:
    """The model's path: a GGUF file (default) or a folder with a config for dummy weights."""
    if not float32:
        sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "parallel"))
        from gguf_tiny import save_tiny_gguf  # the test suite's GGUF writer

        return save_tiny_gguf(d / "model.gguf", layers=layers, context=2048, **SHAPE)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": SHAPE["hidden"], "intermediate_size": SHAPE["inter"],
           "num_attention_heads": SHAPE["heads"], "num_key_value_heads": SHAPE["kv_heads"],
           "num_hidden_layers": layers, "vocab_size": SHAPE["vocab"],
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": True, "torch_dtype": "float32"}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def native_seconds(comm: object) -> float:
    """Seconds rank 0 has spent in the C all-reduce (0 when the communicator has none)."""
    return getattr(comm, "native_seconds", 0.0)


def timed_comm(comm: object, acc: list[float]) -> None:
    """Accumulate into acc[0] the wall time of rank 0's collectives called from Python, less what
    the C all-reduce counts itself (added separately, with the graph's in-call all-reduces)."""
    for name in ("all_reduce", "all_gather", "reduce_scatter"):
        fn = getattr(comm, name)

        def wrapped(*a, _fn=fn, **k):
            t, n = time.perf_counter(), native_seconds(comm)
            try:
                return _fn(*a, **k)
            finally:
                acc[0] += time.perf_counter() - t - (native_seconds(comm) - n)
        setattr(comm, name, wrapped)


def run(model: Path, tp: int, batch: int, new_tokens: int, float32: bool) -> dict:
    import torch
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore
    from infer.core.plugins import get_plugin_host

    torch.set_num_threads(2)
    load = {"load_format": "dummy", "dtype": "float32"} if float32 else {"dtype": "auto"}
    core = EngineCore(ServerArgs(model_path=str(model), tp_size=tp,
                                 max_total_tokens=batch * (128 + new_tokens) + 256,
                                 disable_radix_cache=True, skip_tokenizer_init=True, **load),
                      platform=get_plugin_host().select("cpu"))
    ex = core.executor
    comm = ex.loaded.ctx.comm
    runner = getattr(ex, "runner", None) or core.runner
    graph = runner.graph_runner
    route = (f"native graph, all-reduce: {graph.all_reduce_route}" if graph is not None and graph.ok
             else f"per-op ({getattr(graph, 'reason', 'no graph runner')})")
    comm_s = [0.0]
    timed_comm(comm, comm_s)
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    for i in range(batch):
        core.add_request(core.make_request(f"r{i}", [(7 * i + j) % 40000 + 10 for j in range(128)], params))
    steps = 0
    t_first = None
    while core.has_work():
        outs = core.step()
        if t_first is None and any(o.new_token_ids for o in outs):
            t_first, comm_s[0], steps = time.perf_counter(), 0.0, 0
            pub0 = getattr(ex, "publish_seconds", 0.0)
            nat0 = native_seconds(comm)
        else:
            steps += 1
    elapsed = time.perf_counter() - t_first
    pub = getattr(ex, "publish_seconds", 0.0) - pub0
    coll = comm_s[0] + native_seconds(comm) - nat0
    core.shutdown()
    return {"tok_s": batch * (new_tokens - 1) / elapsed, "step_ms": 1e3 * elapsed / steps,
            "comm_ms": 1e3 * coll / steps, "publish_ms": 1e3 * pub / steps, "decode": route}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--float32", action="store_true",
                    help="float32 dummy weights on the per-op path (default: Q4_1 GGUF, native graph)")
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="infer-tp-bench-"))
    model = make_model(d, a.layers, a.float32)
    results: dict[tuple[int, int], list[dict]] = {}
    for r in range(a.rounds):
        for batch in (1, 32):
            for tp in ((1, 2) if r % 2 == 0 else (2, 1)):
                res = run(model, tp, batch, a.new_tokens, a.float32)
                res["load"] = os.getloadavg()[0]
                results.setdefault((tp, batch), []).append(res)
                print(f"round {r} tp={tp} batch={batch}: {res}", file=sys.stderr, flush=True)
    print("| batch | tp=1 tok/s | tp=2 tok/s | tp=2 / tp=1 | tp=2 step ms | collectives ms/step "
          "| input hand-off ms/step | load |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for batch in (1, 32):
        one = max(results[(1, batch)], key=lambda x: x["tok_s"])
        two = max(results[(2, batch)], key=lambda x: x["tok_s"])
        load = statistics.mean(x["load"] for x in results[(1, batch)] + results[(2, batch)])
        print(f"| {batch} | {one['tok_s']:.1f} | {two['tok_s']:.1f} | {two['tok_s'] / one['tok_s']:.2f} "
              f"| {two['step_ms']:.1f} | {two['comm_ms']:.2f} | {two['publish_ms']:.3f} | {load:.1f} |")


if __name__ == "__main__":
    main()
