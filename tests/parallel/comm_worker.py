"""What each rank runs in test_shm_comm.py (imported by name in spawned children)."""

from __future__ import annotations

import ctypes
import os
from typing import Any

import torch


def _inputs(rank: int, seed: int) -> list[torch.Tensor]:
    """Per-rank inputs: hidden rows, a chunked tensor (over one 1 MiB slot), bf16, a
    non-contiguous view, an odd size."""
    g = torch.Generator().manual_seed(seed * 100 + rank)
    big = torch.randn(300, 1024, generator=g)  # 1.2 MB: two chunks
    return [torch.randn(1, 576, generator=g), torch.randn(32, 4096, generator=g), big,
            torch.randn(7, 96, generator=g).to(torch.bfloat16),
            torch.randn(64, 10, generator=g)[:, ::2], torch.randn(13, generator=g)]


def collectives(rank: int, world: int) -> dict[str, Any]:
    """The shared-memory communicator's all-reduce / all-gather and gloo's on the same inputs."""
    from infer.core.ops.comm import ProcessGroupCommunicator
    from infer_cpu.ops.shm_comm import ShmCommunicator

    shm, gloo = ShmCommunicator(world, rank), ProcessGroupCommunicator(world, rank)
    out: dict[str, Any] = {"shm_used": shm.uses_shared_memory, "reduce": [], "gather": [],
                           "c_vs_torch": []}
    handle = shm.native_all_reduce()
    out["c_entry"] = handle is not None
    for step in range(3):  # repeated collectives cycle through both buffers
        for x in _inputs(rank, step):
            ref = gloo.all_reduce(x.clone())
            got = shm.all_reduce(x.clone())  # float32: the C all-reduce; other dtypes: torch
            out["reduce"].append((got, ref))
            out["gather"].append((shm.all_gather(x, dim=0), gloo.all_gather(x, dim=0)))
            if x.dtype == torch.float32 and handle is not None:
                # the C entry point as the native decode graph calls it, against the torch ops
                via_c = x.contiguous().view(-1).clone()
                if _C_ALL_REDUCE(handle[0])(handle[1], via_c.data_ptr(), via_c.numel()):
                    raise RuntimeError(shm.native_error())
                via_torch = x.contiguous().view(-1).clone()
                shm._all_reduce_torch(via_torch)
                out["c_vs_torch"].append((via_c, via_torch, ref.reshape(-1)))
    return out


_C_ALL_REDUCE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def peer_exits(rank: int, world: int, dtype: torch.dtype = torch.float32) -> str:
    """Rank 1 exits before a collective; rank 0 must raise naming it, not hang (float32: the C
    all-reduce's wait; bf16: the torch path's)."""
    from infer_cpu.ops.shm_comm import ShmCommunicator

    shm = ShmCommunicator(world, rank)
    assert shm.uses_shared_memory
    shm.all_reduce(torch.ones(4, dtype=dtype))
    if rank == 1:
        os._exit(0)
    try:
        shm.all_reduce(torch.ones(4, dtype=dtype))
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def nccl_in_cuda_graph(rank: int, world: int) -> dict[str, Any]:
    """The CUDA plugin's NCCL communicator captured in a CUDA graph: replaying with new inputs
    gives what eager collectives give."""
    from infer_cuda.ops.comm import NcclCommunicator

    torch.cuda.set_device(rank)
    comm = NcclCommunicator(world, rank)
    comm.warmup()
    x = torch.zeros(4, 576, device="cuda")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        summed = comm.all_reduce(x * 1.0)
        gathered = comm.all_gather(x, dim=-1)
    torch.cuda.current_stream().wait_stream(stream)
    new = torch.randn(4, 576, generator=torch.Generator().manual_seed(rank)).cuda()
    x.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    eager_sum = comm.all_reduce(new.clone())
    eager_gather = comm.all_gather(new, dim=-1)
    return {"sum": (summed.cpu(), eager_sum.cpu()), "gather": (gathered.cpu(), eager_gather.cpu())}
