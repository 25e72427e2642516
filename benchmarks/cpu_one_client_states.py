"""The one-client case over time, the engine alone: one request at a time (random ids, like
``infer bench serving`` at concurrency 1, without the HTTP process and the client), each
request's prefill step and its decode steps timed, printed as medians per ``--bucket`` seconds.
It shows whether the machine moves between states during a run, and how prefill and decode move
together.

    python benchmarks/cpu_one_client_states.py --model-path /tmp/smollm2-bf16 \
        --flags '{"dtype": "bfloat16"}' --seconds 45

Session 34 (AMD EPYC Zen 5, 2 vCPUs): the bf16 model's 128-token prefill took 38-41 ms with
decode steps of 6.2-7.3 ms in some stretches and 49-53 ms with decode steps of 5.3-5.6 ms in
others, in this process alone; when a run switched, prefill and decode switched at the same
second. Prompts with no decode steps between them stayed at 38-39 ms for 150 s.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default="smollm2")
    ap.add_argument("--flags", default="{}", help="more ServerArgs fields, as JSON")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128,
                    help="tokens a request generates (1: prefills only)")
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--bucket", type=float, default=3.0, help="seconds a printed median covers")
    args = ap.parse_args()
    if args.output_len < 1 or args.seconds <= 0 or args.bucket <= 0:
        ap.error("--output-len must be at least 1, --seconds and --bucket positive")

    from infer.cli.bench_data import random_id_requests
    from infer.cli.bench_engine import _add, warmup
    from infer.core.config import ServerArgs
    from infer.core.engine.engine_core import EngineCore

    core = EngineCore(ServerArgs(model_path=args.model_path, max_running_requests=8,
                                 **json.loads(args.flags)))
    rng = random.Random(0)
    warmup(core, rng)
    prefill: dict[int, list[float]] = {}
    decode: dict[int, list[float]] = {}
    start = time.perf_counter()
    n = 0
    while (t0 := time.perf_counter()) - start < args.seconds:
        _add(core, f"r{n}", random_id_requests(core.arch.vocab_size,
                                               [(args.input_len, args.output_len)], rng))
        n += 1
        core.step()  # the prompt, and its first token
        t1 = time.perf_counter()
        steps = 0
        while core.has_work():
            core.step()
            steps += 1
        key = int((t0 - start) / args.bucket)
        prefill.setdefault(key, []).append((t1 - t0) * 1e3)
        if steps:
            decode.setdefault(key, []).append((time.perf_counter() - t1) * 1e3 / steps)
        core.flush_cache()
    print(f"{n} requests of {args.input_len} in / {args.output_len} out, one at a time; "
          f"medians per {args.bucket:g} s")
    print("| from (s) | requests | prefill (ms) | decode step (ms) |")
    print("| --- | --- | --- | --- |")
    for key in sorted(prefill):
        d = f"{statistics.median(decode[key]):.2f}" if key in decode else "-"
        print(f"| {key * args.bucket:g} | {len(prefill[key])} | "
              f"{statistics.median(prefill[key]):.1f} | {d} |")


if __name__ == "__main__":
    main()
