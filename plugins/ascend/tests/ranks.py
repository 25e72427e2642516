"""Start the ranks of a multi-process test and wait for them (spawned processes; a rank's
exit code other than 0 fails the test)."""

from __future__ import annotations

import multiprocessing as mp
import socket
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target: Callable[..., None], world: int,
              args: Callable[[int, int, Any], tuple]) -> None:
    """``target(*args(rank, port, barrier))`` in ``world`` spawned processes; ``barrier`` is
    the ranks' teardown handshake (a multiprocessing Barrier of ``world``)."""
    ctx = mp.get_context("spawn")
    port, done = free_port(), ctx.Barrier(world)
    procs = [ctx.Process(target=target, args=args(r, port, done)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
