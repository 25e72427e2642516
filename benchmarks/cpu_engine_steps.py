"""Where an offline run's time goes, step by step: the engine alone (``infer bench offline``'s
requests: random ids, all added at once, ``--max-running-requests`` running) with each step's
rows and wall time logged, summed per kind of step (prefill, mixed prefill + decode, decode), the
decode steps by row count, and the native calls' own times per thread count (from
``ThreadChoice.record``: the bf16 stack's and the GGUF decode graph's).

    python benchmarks/cpu_engine_steps.py --model-path smollm2
    python benchmarks/cpu_engine_steps.py --model-path /tmp/smollm2-bf16 --flags '{"dtype": "bfloat16"}'

A step's wall time runs from its launch to the next one's (scheduling and output handling
included); what the native call does not cover (the default model's LM head, sampling, Python)
is the difference.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any


def batch_shape(batch: Any) -> tuple[int, int]:
    """A scheduled batch's decode rows (one new token each) and prefill tokens (the longer
    extends'); ``cpu_server_steps.py``'s hook counts steps the same way."""
    return (sum(s.extend_len == 1 for s in batch.seqs),
            sum(s.extend_len for s in batch.seqs if s.extend_len > 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default="smollm2")
    ap.add_argument("--flags", default="{}", help="more ServerArgs fields, as JSON")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-running-requests", type=int, default=32)
    args = ap.parse_args()

    import torch
    from infer.cli.bench_engine import run_offline, warmup
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore
    from infer_cpu.kernels import bf16 as kb

    native: list[tuple[int, int, float]] = []  # (rows, threads, seconds) per native call
    record = kb.ThreadChoice.record

    def logged(self: Any, batch: int, threads: int, seconds: float) -> None:
        native.append((batch, threads, seconds))
        record(self, batch, threads, seconds)

    kb.ThreadChoice.record = logged
    core = EngineCore(ServerArgs(model_path=args.model_path,
                                 max_running_requests=args.max_running_requests,
                                 **json.loads(args.flags)))
    rng = random.Random(0)
    warmup(core, rng)
    native.clear()
    steps: list[tuple[int, int, float]] = []  # (decode rows, prefill tokens, launch time)
    launch = core.executor.launch

    def timed(batch: Any, defer: bool) -> Any:
        steps.append((*batch_shape(batch), time.perf_counter()))
        return launch(batch, defer)

    core.executor.launch = timed
    screen_stats = torch.zeros(4, dtype=torch.int64)  # the bf16 stack's greedy head, if it ran
    kb.load().infer_bf16_screen_stats(screen_stats.data_ptr())
    res = run_offline(core, args.num_prompts, args.input_len, args.output_len, 1.0, rng,
                      progress=False)
    ends = [t for _, _, t in steps[1:]] + [time.perf_counter()]
    print(f"{res['num_requests']} requests, {res['duration_s']:.2f} s, "
          f"{res['output_throughput']:.1f} output tok/s")
    kinds: dict[str, list[float]] = {}
    by_rows: dict[int, list[float]] = {}
    for (dec, pre, t0), t1 in zip(steps, ends, strict=True):
        kind = ("mixed" if dec else "prefill") if pre else "decode"
        k = kinds.setdefault(kind, [0, 0.0, 0, 0])
        k[0] += 1
        k[1] += t1 - t0
        k[2] += dec
        k[3] += pre
        if not pre:
            by_rows.setdefault(dec, []).append(t1 - t0)
    print("| step | steps | seconds | ms a step | decode rows | prefill tokens |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind, (n, sec, dec, pre) in kinds.items():
        print(f"| {kind} | {n} | {sec:.2f} | {sec / n * 1e3:.1f} | {dec} | {pre} |")
    print("decode steps by rows (steps, mean ms): "
          + ", ".join(f"{r}: {len(v)} x {statistics.mean(v) * 1e3:.1f}"
                      for r, v in sorted(by_rows.items())))
    for rows_class, what in ((args.max_running_requests, "decode"), (None, "extend")):
        for threads in sorted({t for _, t, _ in native}):
            xs = [s for r, t, s in native if t == threads
                  and (r == rows_class if rows_class else r > args.max_running_requests)]
            if xs:
                print(f"native {what} calls{'' if rows_class is None else f' of {rows_class} rows'}"
                      f" on {threads} thread(s): {len(xs)}, mean {statistics.mean(xs) * 1e3:.1f} ms")
    kb.load().infer_bf16_screen_stats(screen_stats.data_ptr())
    rows, cands, full, units = screen_stats.tolist()
    if rows:
        print(f"greedy head: {rows} rows screened, {cands / rows:.1f} candidates a row computed "
              f"exactly, {full} rows on every logit, {units} units computed whole")


if __name__ == "__main__":
    main()
