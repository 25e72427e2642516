"""One rank of the expert-parallel test (test_moe_ep.py): gloo stands in for HCCL."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def run(rank: int, world: int, port: int, out_dir: str, emulated: bool) -> None:
    if emulated:
        sys.path.insert(0, str(Path(__file__).resolve().parent / "npu_emulation"))
        import ascend_emulation

        ascend_emulation.install("A2")
    import torch
    import torch.distributed as dist
    from infer_ascend.ops.comm import HcclCommunicator
    from infer_ascend.ops.moe import AscendMoERunner

    if not emulated:
        import torch_npu  # noqa: F401 (registers torch.npu)

        torch.npu.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    backend = "gloo" if emulated else "hccl"
    dist.init_process_group(backend, rank=rank, world_size=world)
    device = torch.device("cpu" if emulated else f"npu:{rank}")
    torch.manual_seed(0)  # every rank builds the same tokens, routing and experts
    t, d, inter, e, k = 9, 32, 16, 8, 2
    x = torch.randn(t, d).half().to(device)
    w13 = (torch.randn(e, 2 * inter, d) / d ** 0.5).half().to(device)
    w2 = (torch.randn(e, d, inter) / inter ** 0.5).half().to(device)
    weights, ids = torch.topk(torch.softmax(torch.randn(t, e), -1), k, -1)
    weights, ids = weights.to(device), ids.to(device)
    local = e // world
    comm = HcclCommunicator(world, rank)
    ep = AscendMoERunner(ep_size=world, ep_rank=rank, comm=comm)
    out = ep.apply(x, w13[rank * local:(rank + 1) * local], w2[rank * local:(rank + 1) * local],
                   weights, ids)
    one = AscendMoERunner().apply(x, w13, w2, weights, ids)  # the one-rank result
    gathered = comm.all_gather(torch.full((2, 3), float(rank), device=device), dim=0)
    cols = comm.all_gather(torch.full((2, 1), float(rank), device=device), dim=-1)
    torch.save({"ep": out.cpu(), "one": one.cpu(), "gathered": gathered.cpu(), "cols": cols.cpu()},
               Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()
