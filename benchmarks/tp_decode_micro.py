"""Decode step time of a model split over tensor-parallel ranks on this CPU, and the share of it
spent in collectives: tp=N (N spawned ranks, one torch thread each, the platform communicator:
shared memory, or gloo with --gloo) against tp=1 (one process with N threads), alternating in
rounds. Model-level (the test-only paged driver, no engine or scheduler): random weights
(``--load-format dummy``) of a Llama-shaped config; B sequences prefilled with 32 tokens, then
``--steps`` decode steps timed.

    python benchmarks/tp_decode_micro.py                      # Qwen2-0.5B-like shape, B 1 and 32
    python benchmarks/tp_decode_micro.py --gloo --layers 8
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

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CPU plugin runs (shared cores)
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "parallel"), str(ROOT / "tests" / "model")]

import torch  # noqa: E402

PROMPT = 32


def _config(layers: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 896,
            "intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2,
            "num_hidden_layers": layers, "vocab_size": 32000, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096, "torch_dtype": "float32"}


class _Timed:
    """Wraps a communicator, adding up the seconds spent in its collectives."""

    def __init__(self, comm: object) -> None:
        self.comm, self.seconds = comm, 0.0

    def __getattr__(self, name: str) -> object:
        fn = getattr(self.comm, name)
        if name not in ("all_reduce", "all_gather", "reduce_scatter"):
            return fn

        def timed(*a: object, **k: object) -> object:
            t = time.perf_counter()
            out = fn(*a, **k)
            self.seconds += time.perf_counter() - t
            return out
        return timed


def _decode(rank: int, world: int, path: str, batches: list[int], steps: int,
            gloo: bool) -> dict[int, tuple[float, float]]:
    """{batch: (ms per decode step, ms of it in collectives)} on this rank."""
    from tp_worker import load, rank_driver

    loaded = load(path, tp_size=world, tp_rank=rank, load_format="dummy", page_size=16)
    if gloo and world > 1:
        from infer.core.ops.comm import ProcessGroupCommunicator

        loaded.ctx.comm = ProcessGroupCommunicator(world, rank)
    timed = _Timed(loaded.ctx.comm)
    for m in loaded.model.modules():  # every layer holding the communicator
        if getattr(m, "comm", None) is not None:
            m.comm = timed
    out = {}
    for b in batches:
        driver = rank_driver(loaded, 16, num_pages=b * (PROMPT + steps + 16) // 16 + 8)
        gen = torch.Generator().manual_seed(0)
        driver.step([(i, torch.randint(0, 32000, (PROMPT,), generator=gen).tolist())
                     for i in range(b)], all_logits=False)
        times, comm = [], []
        for _ in range(steps):
            timed.seconds = 0.0
            t = time.perf_counter()
            driver.step([(i, [1]) for i in range(b)], all_logits=False)
            times.append(time.perf_counter() - t)
            comm.append(timed.seconds)
        out[b] = (statistics.median(times) * 1e3, statistics.median(comm) * 1e3)
    return out


def main() -> None:
    from ranks import run_ranks

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gloo", action="store_true", help="gloo collectives, not shared memory")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(_config(args.layers)))
        rows = []
        for r in range(args.rounds):
            torch.set_num_threads(args.tp)
            one = _decode(0, 1, tmp, args.batch, args.steps, False)
            many = run_ranks(_decode, args.tp, tmp, args.batch, args.steps, args.gloo)[0]
            rows += [(r, b, one[b][0], many[b][0], many[b][1]) for b in args.batch]
    print(f"Llama-shaped, hidden 896, 14 heads / 2 KV heads, {args.layers} layers, float32, "
          f"{'gloo' if args.gloo else 'platform communicator'}; load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'round':>5} {'batch':>5} {'tp=1 ms':>8} {f'tp={args.tp} ms':>8} {'in collectives ms (incl. waiting)':>34}")
    for r, b, t1, tn, c in rows:
        print(f"{r:>5} {b:>5} {t1:>8.1f} {tn:>8.1f} {c:>34.1f}")


if __name__ == "__main__":
    main()
