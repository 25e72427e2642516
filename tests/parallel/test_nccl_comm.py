"""The CUDA plugin's NCCL communicator inside a CUDA graph (two GPUs, one rank each): the
captured all-reduce and all-gather, replayed on new inputs, equal the eager collectives. Skips
without two GPUs (not run on this project's machines so far)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs two CUDA GPUs")]


def test_nccl_collectives_replay_in_a_cuda_graph():
    pytest.importorskip("infer_cuda")
    from comm_worker import nccl_in_cuda_graph
    from ranks import run_ranks

    for rank, r in enumerate(run_ranks(nccl_in_cuda_graph, 2, platform="cuda")):
        for name, (captured, eager) in r.items():
            assert torch.equal(captured, eager), f"rank {rank} {name}"
