"""Tensor parallelism on this CPU: tp=2 (two rank processes, one thread each) against tp=1 (one
process, two threads), decode at batch 1 and 32, alternating in one run.

    python benchmarks/parallel_cpu.py [--rounds 2] [--new-tokens 64] [--layers 30]

The model is a SmolLM2-135M-like Llama with random float32 weights (hidden 576 does not split
over 9 heads at tp=2, so heads are 8 x 64 here, 4 KV heads). Per configuration it prints decode
tokens/s, the time rank 0 spends in collectives per step (all-reduce / all-gather, including
waiting for the other rank), and the time to hand a step's inputs to the other ranks.
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


def make_model(d: Path, layers: int) -> None:
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
           "intermediate_size": 1536, "num_attention_heads": 8, "num_key_value_heads": 4,
           "num_hidden_layers": layers, "vocab_size": 49152, "max_position_embeddings": 2048,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
           "torch_dtype": "float32"}
    (d / "config.json").write_text(json.dumps(cfg))


def timed_comm(comm: object, acc: list[float]) -> None:
    """Accumulate the wall time of rank 0's collectives into acc[0]."""
    for name in ("all_reduce", "all_gather", "reduce_scatter"):
        fn = getattr(comm, name)

        def wrapped(*a, _fn=fn, **k):
            t = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                acc[0] += time.perf_counter() - t
        setattr(comm, name, wrapped)


def run(model_dir: Path, tp: int, batch: int, new_tokens: int) -> dict:
    import torch
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore
    from infer.core.plugins import get_plugin_host

    torch.set_num_threads(2)
    core = EngineCore(ServerArgs(model_path=str(model_dir), load_format="dummy", dtype="float32",
                                 tp_size=tp, max_total_tokens=batch * (128 + new_tokens) + 256,
                                 disable_radix_cache=True, skip_tokenizer_init=True),
                      platform=get_plugin_host().select("cpu"))
    comm_s = [0.0]
    timed_comm(core.executor.loaded.ctx.comm, comm_s)
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    for i in range(batch):
        core.add_request(core.make_request(f"r{i}", [(7 * i + j) % 40000 + 10 for j in range(128)], params))
    steps = 0
    t_first = None
    while core.has_work():
        outs = core.step()
        if t_first is None and any(o.new_token_ids for o in outs):
            t_first, comm_s[0], steps = time.perf_counter(), 0.0, 0
            pub0 = getattr(core.executor, "publish_seconds", 0.0)
        else:
            steps += 1
    elapsed = time.perf_counter() - t_first
    pub = getattr(core.executor, "publish_seconds", 0.0) - pub0
    core.shutdown()
    return {"tok_s": batch * (new_tokens - 1) / elapsed, "step_ms": 1e3 * elapsed / steps,
            "comm_ms": 1e3 * comm_s[0] / steps, "publish_ms": 1e3 * pub / steps}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--layers", type=int, default=30)
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="infer-tp-bench-"))
    make_model(d, a.layers)
    results: dict[tuple[int, int], list[dict]] = {}
    for r in range(a.rounds):
        for batch in (1, 32):
            for tp in ((1, 2) if r % 2 == 0 else (2, 1)):
                res = run(d, tp, batch, a.new_tokens)
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
