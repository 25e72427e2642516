"""The CPU shared-memory all-reduce in C (``infer_cpu_comm.c``, what ``ShmCommunicator.all_reduce``
and the native decode graph use for float32) against the same exchange in torch ops
(``ShmCommunicator._all_reduce_torch``), 2 local ranks with one thread each, on hidden rows of
512 floats. Prints the median and 10th-percentile microseconds per all-reduce and the load.

    python benchmarks/allreduce_c_vs_torch.py [--iters 3000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "parallel"))  # ranks.py


def bench(rank: int, world: int, iters: int) -> dict[tuple[int, str], tuple[float, float]]:
    import torch
    from infer_cpu.ops.shm_comm import ShmCommunicator

    shm = ShmCommunicator(world, rank)
    assert shm.native_all_reduce() is not None, "the C all-reduce is not built"
    out = {}
    for rows in (1, 32):
        x = torch.randn(rows, 512)
        ways = {"C": lambda t: shm.all_reduce(t),
                "torch ops": lambda t: shm._all_reduce_torch(t.view(-1))}
        for name, fn in ways.items():
            ts = []
            for _ in range(iters):
                t = time.perf_counter()
                fn(x)
                ts.append(time.perf_counter() - t)
            ts.sort()
            out[(rows, name)] = (1e6 * statistics.median(ts), 1e6 * ts[len(ts) // 10])
    return out


def main() -> None:
    from ranks import run_ranks

    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=3000)
    a = ap.parse_args()
    load = os.getloadavg()[0]
    res = run_ranks(bench, 2, a.iters)[0]
    print(f"load {load:.1f} -> {os.getloadavg()[0]:.1f}")
    print("| rows x 512 | all-reduce | median us | p10 us |\n| --- | --- | --- | --- |")
    for (rows, name), (med, p10) in res.items():
        print(f"| {rows} | {name} | {med:.1f} | {p10:.1f} |")


if __name__ == "__main__":
    main()
