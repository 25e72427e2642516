"""Expert parallelism over two real processes (gloo standing in for HCCL; HCCL on an NPU with
INFER_ASCEND_HARDWARE=1): each rank holds half the experts, and the all-reduced result equals
the one-rank MoE runner's. The core has no multi-rank MoE executor yet (its MoE layer runs with
one rank), so this drives the runner's EP path directly."""

from __future__ import annotations

import multiprocessing as mp
import socket
import sys
from pathlib import Path

import torch

from .conftest import HARDWARE

HERE = Path(__file__).resolve().parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ep2_matches_one_rank(tmp_path):
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import ascend_ep_worker

    ctx = mp.get_context("spawn")
    port = _port()
    procs = [ctx.Process(target=ascend_ep_worker.run, args=(r, 2, port, str(tmp_path), not HARDWARE))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    res = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for r in res:
        torch.testing.assert_close(r["ep"].float(), r["one"].float(), atol=2e-3, rtol=2e-3)
        assert r["gathered"].tolist() == [[0.0] * 3] * 2 + [[1.0] * 3] * 2
        assert r["cols"].tolist() == [[0.0, 1.0]] * 2
    torch.testing.assert_close(res[0]["ep"], res[1]["ep"])
