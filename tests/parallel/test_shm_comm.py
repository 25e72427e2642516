"""The CPU plugin's shared-memory communicator against gloo, with real processes: all-reduce and
all-gather give gloo's results (bit for bit with 2 ranks, where the sum has one order; within
float rounding with 3), for hidden rows, multi-chunk tensors, bf16 and non-contiguous inputs,
identically on every rank; a rank that exits mid-run makes the others raise, naming it."""

from __future__ import annotations

import pytest
import torch
from comm_worker import collectives, peer_exits
from ranks import run_ranks


@pytest.mark.parametrize("world", [2, 3])
def test_shared_memory_collectives_match_gloo(world):
    results = run_ranks(collectives, world)
    assert all(r["shm_used"] for r in results)
    for rank, r in enumerate(results):
        for (got, ref), (gathered, gloo_gathered) in zip(r["reduce"], r["gather"], strict=True):
            assert torch.equal(gathered, gloo_gathered), f"rank {rank}"
            assert got.dtype == ref.dtype and got.shape == ref.shape
            if world == 2:
                assert torch.equal(got, ref), f"rank {rank}"
            else:  # another summation order than gloo's: both within rounding of the exact sum
                parts = torch.stack(gathered.chunk(world, dim=0)).double()  # [W, ...] inputs
                unit = torch.finfo(got.dtype).eps / 2
                bound = (world - 1) * unit * parts.abs().sum(0) + 1e-30
                assert ((got.double() - parts.sum(0)).abs() <= bound).all(), f"rank {rank}"
    for a, b in zip(results[0]["reduce"], results[-1]["reduce"], strict=True):
        assert torch.equal(a[0], b[0])  # every rank holds the same sum


def test_exited_peer_is_an_error_not_a_hang():
    message = run_ranks(peer_exits, 2, timeout=60, wait_for=[0])[0]
    assert "rank 1" in message and "exited" in message
