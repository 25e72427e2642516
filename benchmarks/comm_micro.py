"""All-reduce latency between local ranks: gloo (torch.distributed over loopback) against the CPU
plugin's shared-memory communicator, on hidden-state shapes (rows x hidden, float32), 2 ranks
with one torch thread each, alternating the two in rounds on the same tensors. Prints the
median microseconds per all-reduce (and the load average, since cores here are shared).

    python benchmarks/comm_micro.py
    python benchmarks/comm_micro.py --ranks 3 --iters 500 --hidden 576 4096 --rows 1 32 128
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CPU plugin runs (shared cores)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def _time(fn, x: torch.Tensor, iters: int) -> float:
    """Median microseconds of one call; all ranks barrier first so they start together."""
    dist.barrier()
    samples = []
    for _ in range(iters):
        t = time.perf_counter()
        fn(x)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def _rank(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    from infer.core.ops.comm import ProcessGroupCommunicator
    from infer_cpu.ops.shm_comm import ShmCommunicator

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    gloo, shm = ProcessGroupCommunicator(world, rank), ShmCommunicator(world, rank)
    assert shm.uses_shared_memory
    results: dict[tuple[int, int], dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for hidden in args.hidden:
            for rows in args.rows:
                x = torch.randn(rows, hidden)
                for name, comm in (("gloo", gloo), ("shm", shm)):
                    for _ in range(10):  # warm-up
                        comm.all_reduce(x)
                    us = _time(comm.all_reduce, x, args.iters)
                    results.setdefault((hidden, rows), {}).setdefault(name, []).append(us)
    if rank == 0:
        print(f"{world} ranks, 1 thread each, float32, median of {args.iters} calls, best of "
              f"{args.rounds} alternating rounds; load average {os.getloadavg()[0]:.2f}")
        print(f"{'hidden':>7} {'rows':>5} {'gloo us':>9} {'shm us':>8} {'speed-up':>8}")
        for (hidden, rows), r in results.items():
            g, s = min(r["gloo"]), min(r["shm"])
            print(f"{hidden:>7} {rows:>5} {g:>9.1f} {s:>8.1f} {g / s:>7.1f}x")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--hidden", type=int, nargs="+", default=[576, 1024, 2048, 4096])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(args.ranks, port, args), nprocs=args.ranks)


if __name__ == "__main__":
    main()
