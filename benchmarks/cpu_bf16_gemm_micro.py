"""The CPU plugin's bf16 GEMM (``kernels.bf16.gemm``: packed bf16 weights, float32 activations
rounded to bf16, float32 sums) against torch's float32 and bf16 matmuls on SmolLM2-135M's layer
shapes, in G multiply-adds a second (M x N x K / best time).

    python benchmarks/cpu_bf16_gemm_micro.py [--threads 2] [-m 1 32 128] [--budget 0.4]

torch's bf16 matmul is what a bf16 model's linear layers run where no native bf16 kernel serves
them (vLLM's CPU build falls back to it on CPUs without AVX-512 BF16).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from infer_cpu.kernels import bf16 as kb

SHAPES = {"qkv": (960, 576), "gate_up": (3072, 576), "down": (576, 1536)}


def best_time(fn, budget: float) -> float:
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < budget:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-m", "--rows", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--budget", type=float, default=0.4, help="seconds per timing")
    args = ap.parse_args()
    lib = kb.load()
    if lib is None:
        raise SystemExit(f"bf16 kernels unavailable: {kb.detail()}")
    torch.set_num_threads(args.threads)
    lib.infer_bf16_set_threads(args.threads)
    print(f"threads {args.threads}, ISA path {kb.isa()}, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    g = torch.Generator().manual_seed(0)
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, generator=g).bfloat16()
        packed, wf = kb.pack(w), w.float()
        for m in args.rows:
            x = torch.randn(m, k, generator=g)
            xb = x.bfloat16()
            cells = []
            calls = (("infer bf16", lambda x=x, p=packed: kb.gemm(x, p)),
                     ("torch float32", lambda x=x, wf=wf: x @ wf.t()),
                     ("torch bf16", lambda xb=xb, w=w: xb @ w.t()))
            for label, fn in calls:
                cells.append(f"{label} {m * n * k / best_time(fn, args.budget) / 1e9:6.1f}")
            print(f"{name:8s} N={n:5d} K={k:5d} M={m:4d} | " + " | ".join(cells) + " GMAC/s")


if __name__ == "__main__":
    main()
