"""bf16 engine A/B on this CPU: one plugin tree against another, alternating, in one run.

    python benchmarks/cpu_bf16_ab.py --base /tmp/bf16base/plugins/cpu [--rounds 3]

Each variant runs in a subprocess with ``PYTHONPATH=<plugin dir>`` (the editable install's
finder comes after PYTHONPATH, so the given ``infer_cpu`` tree is imported; ``--new`` defaults to
this checkout's). In that process: an ``EngineCore`` on the bf16 SmolLM2 folder
(``benchmarks/out/smollm2-bf16``, made by ``run_cpu.py --vllm-peer``), a warm-up, then per round
a 32 x 128-token prefill (time until every request has its first token), a 1 x 128 prefill, and
decode at batch 1, 8 and 32 (median step time over ``--new-tokens`` steps after a 128-token
prompt). The load average is printed before and after each variant run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL = HERE / "out" / "smollm2-bf16"


def child(new_tokens: int) -> dict:
    import random

    import torch
    from infer.cli.bench_engine import run_one_batch, warmup
    from infer.core.config.server_args import ServerArgs
    from infer.core.engine.engine_core import EngineCore

    core = EngineCore(ServerArgs(model_path=str(MODEL), dtype="bfloat16", skip_tokenizer_init=True,
                                 disable_radix_cache=True))
    rng = random.Random(0)
    warmup(core, rng)
    res = {"threads": torch.get_num_threads(),
           "graph": getattr(core.runner.graph_runner, "reason", None) or "ok"}
    res["prefill_32x128_s"] = run_one_batch(core, 32, 128, 1, rng)["prefill_latency_s"]
    res["prefill_1x128_s"] = run_one_batch(core, 1, 128, 1, rng)["prefill_latency_s"]
    for b in (1, 8, 32):
        r = run_one_batch(core, b, 128, new_tokens + 1, rng)
        res[f"decode_b{b}_ms"] = r["decode_latency_median_s"] * 1000
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="plugin dir (holding infer_cpu) of the baseline")
    ap.add_argument("--new", default=str(HERE.parent / "plugins" / "cpu"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a.new_tokens)), flush=True)
        return
    rows = []
    for r in range(a.rounds):
        for name, path in (("base", a.base), ("new", a.new)):
            env = dict(os.environ, PYTHONPATH=path)
            load0 = os.getloadavg()
            proc = subprocess.run([sys.executable, __file__, "--child", "--base", a.base,
                                   "--new-tokens", str(a.new_tokens)], env=env,
                                  capture_output=True, text=True)
            load1 = os.getloadavg()
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode or not line:
                print(proc.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{name} failed")
            res = json.loads(line[0][7:])
            res.update(variant=name, round=r, load_before=[round(x, 2) for x in load0],
                       load_after=[round(x, 2) for x in load1])
            rows.append(res)
            print(json.dumps(res), flush=True)
    keys = [k for k in rows[0] if k.endswith(("_s", "_ms"))]
    print("\nbest (min) per variant:")
    for name in ("base", "new"):
        best = {k: min(r[k] for r in rows if r["variant"] == name) for k in keys}
        print(name, json.dumps({k: round(v, 4) for k, v in best.items()}))


if __name__ == "__main__":
    main()
