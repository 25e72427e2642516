"""The matmuls of one SmolLM2-135M decode step (30 layers: qkv 576->960, o 576->576,
gate_up 576->3072, down 1536->576) with torch's CPU kernels: int4 group-32, per-row int8 and
float32 dense, at 1 and 4 rows. Prints median and best wall time of 15 runs.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/micro_cpu_matmul.py
"""

from __future__ import annotations

import time

import torch

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in)
LAYERS = 30


def timed(fn) -> tuple[float, float]:
    fn()
    ts = []
    for _ in range(15):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2] * 1000, ts[0] * 1000


def main() -> None:
    print(f"threads {torch.get_num_threads()}")
    int4 = [(torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        torch.randint(0, 16, (o, i), dtype=torch.int32), 1),
        torch.rand(i // 32, o, 2, dtype=torch.bfloat16), i) for o, i in SHAPES]
    int8 = [(torch.randint(-127, 127, (o, i), dtype=torch.int8), torch.rand(o, dtype=torch.bfloat16))
            for o, i in SHAPES]
    dense = [torch.randn(o, i) for o, i in SHAPES]
    for rows in (1, 4):
        xb = {i: torch.randn(rows, i, dtype=torch.bfloat16) for i in (576, 1536)}
        xf = {i: torch.randn(rows, i) for i in (576, 1536)}
        cases = {
            "int4 g32 (bf16 act)": lambda xb=xb: [torch.ops.aten._weight_int4pack_mm_for_cpu(xb[i], p, 32, sz)
                                            for p, sz, i in int4 for _ in range(LAYERS)],
            "int8 per-row (bf16 act)": lambda xb=xb: [torch.ops.aten._weight_int8pack_mm(xb[w.shape[1]], w, s)
                                                for w, s in int8 for _ in range(LAYERS)],
            "float32 dense": lambda xf=xf: [torch.nn.functional.linear(xf[w.shape[1]], w)
                                      for w in dense for _ in range(LAYERS)],
        }
        for name, fn in cases.items():
            med, best = timed(fn)
            print(f"rows {rows}: {name}: median {med:.1f} ms, best {best:.1f} ms")


if __name__ == "__main__":
    main()
