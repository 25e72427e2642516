"""Run one function on N local ranks: spawned processes, one torch thread each, a process group
over the platform's distributed backend (gloo on this CPU) on 127.0.0.1.

``run_ranks(fn, world_size, *args)`` returns ``[fn(rank, world_size, *args) for each rank]``
(results travel back through a queue, tensors included) and raises with the failing rank's
traceback when any rank raises or dies. ``fn`` must live in a module that a spawned child can
import by name (conftest.py puts this folder on ``sys.path``).
"""

from __future__ import annotations

import pickle
import queue
import socket
import time
import traceback
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, results: Any, fn: Any, args: tuple,
           platform: str) -> None:
    import torch
    import torch.distributed as dist
    from infer.core.plugins import get_plugin_host

    torch.set_num_threads(1)
    backend = get_plugin_host().select(platform).dist_backend
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        # plain pickle: tensors by value (shared-memory handles die with this process)
        results.put((rank, True, pickle.dumps(fn(rank, world_size, *args))))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Any, world_size: int, *args: Any, timeout: float = 600.0,
              wait_for: list[int] | None = None, platform: str = "cpu") -> list[Any]:
    """``wait_for``: the ranks whose results are awaited (default all; None for the others);
    ``platform``: whose ``dist_backend`` the process group uses."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, results, fn, args, platform), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        wanted = set(range(world_size) if wait_for is None else wait_for)
        while not wanted <= set(out):
            try:
                rank, ok, value = results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs)
                        if p.exitcode is not None and r in wanted and r not in out]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"ranks {sorted(wanted - set(out))} gave "
                                       f"no result (exited without one: {dead})") from None
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            out[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [out.get(r) for r in range(world_size)]
