"""The default model's whole GEMM stack through ``kernels.fgemm``: every layer's qkv, o, gate/up and
down products and the Q8_0 LM head, one after another at M activation rows, as a decode step (or a
prefill chunk) runs them: the weights stream from memory as they do in serving, which
``cpu_qgemm_micro.py`` (layer 0 only, hot in the caches) does not show. Prints the minimum and
median time of a pass over ``--steps`` passes and the multiply-adds a second at the minimum. Each
GEMM here is its own call (Python, ctypes, an OpenMP team: some 0.1 ms), which the decode graph's
one native call per step does not pay, so small M reads low (8 rows: about a third of the time).

    python benchmarks/cpu_qgemm_stack.py -m 8 32 128 --activations int16
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CPU plugin runs (shared cores)

import gguf  # noqa: E402
import torch  # noqa: E402
from cpu_qgemm_micro import fused_layer, lm_head_q8, loadavg  # noqa: E402
from infer.core.model.loader.default_model import ensure_default_model  # noqa: E402
from infer_cpu import kernels  # noqa: E402
from infer_cpu.quant.packing import QWeight  # noqa: E402


def stack(precision: str) -> list[QWeight]:
    """Every layer's four fused projections, then the LM head, in ``precision`` activations."""
    path = ensure_default_model()
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    layers = 1 + max(int(n.split(".")[1]) for n in tensors if n.startswith("blk."))
    out = [w for layer in range(layers) for w in fused_layer(tensors, layer).values()]
    return [w.with_activations(precision) for w in [*out, lm_head_q8(path)]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--rows", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--activations", default="int16", choices=["int16", "int8", "float32"])
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    if kernels.load() is None:
        raise SystemExit(f"native kernels unavailable: {kernels.status().detail}")
    ws = stack(args.activations)
    macs = sum(w.out_features * w.in_features for w in ws)
    print(f"{len(ws)} GEMMs, {macs / 1e6:.0f} M multiply-adds a row, {args.activations} activations, "
          f"threads {torch.get_num_threads()}, load {loadavg()}")
    for m in args.rows:
        xs = {w.in_features: torch.randn(m, w.in_features) for w in ws}

        def step(xs: dict[int, torch.Tensor] = xs) -> None:
            for w in ws:
                kernels.fgemm(xs[w.in_features], w)

        step()
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        print(f"M={m:4d}: min {min(times) * 1e3:8.1f} ms, median {statistics.median(times) * 1e3:8.1f} ms, "
              f"{macs * m / min(times) / 1e9:6.1f} G multiply-adds/s")
    print(f"load {loadavg()}")


if __name__ == "__main__":
    main()
