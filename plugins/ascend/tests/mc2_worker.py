"""One rank of test_mc2_emulation.py: the emulated MC2 dispatch/combine (A3) over eight gloo
ranks standing in for HCCL, checked against layouts and sums computed here by hand from every
rank's inputs (each rank regenerates all ranks' inputs from their seeds)."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
H, E, K = 7168, 16, 2  # A3 needs H == 7168; 16 experts over 8 ranks: 2 local experts each


def inputs(rank: int, bs: int) -> tuple[Any, Any, Any]:
    """Rank ``rank``'s tokens [bs, H] float16, distinct expert ids int32 [bs, K], weights float32."""
    import torch

    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(bs, H, generator=g).to(torch.float16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(bs)]).to(torch.int32)
    return x, ids, torch.rand(bs, K, generator=g)


def _expect_error(fn: Any, kind: type, text: str) -> None:
    try:
        fn()
    except kind as e:
        assert text in str(e), (text, str(e))
        return
    raise AssertionError(f"no {kind.__name__} for {text!r}")


def check(rank: int, world: int, name: str, sizes: list[int], global_bs: int) -> None:
    import torch
    import torch_npu

    bs = sizes[rank]
    x, ids, scales = inputs(rank, bs)
    local = E // world
    out = torch_npu.npu_moe_distribute_dispatch(x, ids, name, world, rank, E,
                                                global_bs=global_bs, expert_token_nums_type=1)
    expand_x, dyn, expand_idx, tok_nums, recv, tp_recv, exp_scales = out
    assert dyn is None and exp_scales is None and tp_recv.numel() == 0
    a = (global_bs or bs * world) * min(local, K)
    assert expand_x.shape == (a, H) and expand_x.dtype == torch.float16
    assert expand_idx.dtype == torch.int32 and expand_idx.shape == (bs * K,)
    assert recv.dtype == torch.int32 and recv.shape == (world * local,)
    assert tok_nums.dtype == torch.int64 and tok_nums.shape == (local,)
    # by hand: rows of local expert e, from source rank r in r's token order
    want_rows, want_recv, n = [], [], 0
    for e in range(local):
        expert = rank * local + e
        for src in range(world):
            sx, sids, _ = inputs(src, sizes[src])
            for t in range(sizes[src]):
                if expert in sids[t].tolist():
                    want_rows.append(sx[t])
                    n += 1
            want_recv.append(n)
    assert recv.tolist() == want_recv, (recv.tolist(), want_recv)
    assert torch.equal(expand_x[:n], torch.stack(want_rows)) and not expand_x[n:].any()
    per_expert = [want_recv[(e + 1) * world - 1] - (want_recv[e * world - 1] if e else 0)
                  for e in range(local)]
    assert tok_nums.tolist() == per_expert
    flat = ids.reshape(-1).tolist()
    assert expand_idx.tolist() == [sum(flat[q] == flat[p] for q in range(p - p % K))
                                   for p in range(bs * K)]
    cum = torch_npu.npu_moe_distribute_dispatch(x, ids, name, world, rank, E, global_bs=global_bs,
                                                expert_token_nums_type=0)[3]
    assert cum.tolist() == torch.tensor(per_expert).cumsum(0).tolist()
    # combine: "expert" e's output is its input row times (e + 1); sums weighted by scales
    owner_of_row = torch.zeros(a)
    owner_of_row[:n] = torch.tensor([float(rank * local + e + 1) for e in range(local)
                                     for _ in range(per_expert[e])])
    y = (expand_x.float() * owner_of_row[:, None]).to(torch.float16)
    got = torch_npu.npu_moe_distribute_combine(y, ids, expand_idx, recv, scales, name, world,
                                               rank, E, tp_send_counts=tp_recv,
                                               global_bs=global_bs)
    assert got.shape == (bs, H) and got.dtype == torch.float16
    want = ((ids.float() + 1) * scales).sum(1)[:, None] * x.float()
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-3)
    # argument semantics the device enforces
    _expect_error(lambda: torch_npu.npu_moe_distribute_combine(
        y, ids, expand_idx, recv, scales.half(), name, world, rank, E, global_bs=global_bs),
        TypeError, "expert_scales")
    _expect_error(lambda: torch_npu.npu_moe_distribute_dispatch(
        x, ids.long(), name, world, rank, E, global_bs=global_bs), TypeError, "expert_ids")
    _expect_error(lambda: torch_npu.npu_moe_distribute_combine(
        y, ids, expand_idx.view(K, bs).t().reshape(-1)[:-1], recv, scales, name, world, rank, E,
        global_bs=global_bs), ValueError, "expand_idx must be [BS * K]")


def run(rank: int, world: int, port: int, done: Any, failed: Any) -> None:
    """All checks on this rank; teardown as ascend_ep_worker.run (a barrier after the last
    collective and after destroying the group)."""
    sys.path.insert(0, str(HERE / "npu_emulation"))
    import ascend_emulation

    ascend_emulation.install("A3")
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch_npu

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("hccl", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        group = dist.new_group(ranks=list(range(world)), backend="hccl")
        name = group._get_backend(torch.device("cpu")).get_hccl_comm_name(rank)
        check(rank, world, name, [3] * world, 0)  # equal BS, global_bs 0
        sizes = [1 + r % 3 for r in range(world)]  # BS differs per rank: global_bs = max * W
        check(rank, world, name, sizes, max(sizes) * world)
        x, ids, _ = inputs(rank, 2)
        dup = ids.clone()
        dup[:, 1] = dup[:, 0]
        _expect_error(lambda: torch_npu.npu_moe_distribute_dispatch(
            x, dup, name, world, rank, E), ValueError, "distinct")
        _expect_error(lambda: torch_npu.npu_moe_distribute_dispatch(
            x[:, :4096].contiguous(), ids, name, world, rank, E), ValueError, "7168")
        _expect_error(lambda: torch_npu.npu_moe_distribute_dispatch(
            x, ids, name, world, (rank + 1) % world, E), ValueError, "ep_rank_id")
        _expect_error(lambda: torch_npu.npu_moe_distribute_dispatch(
            x, ids, name, world, rank, E, global_bs=7), ValueError, "global_bs")
        sizes = [1 + r % 2 for r in range(world)]
        xs, ids2, _ = inputs(rank, sizes[rank])
        _expect_error(lambda: torch_npu.npu_moe_distribute_dispatch(
            xs, ids2, name, world, rank, E), ValueError, "same BS")
        ascend_emulation.install("A2")
        _expect_error(lambda: torch_npu.npu_moe_distribute_dispatch(
            x, ids, name, world, rank, E), ValueError, "A3")
    except BaseException:
        traceback.print_exc()
        failed.set()
    done.wait(timeout=300)  # every rank is past its last collective
    dist.destroy_process_group()
    done.wait(timeout=300)  # every rank has destroyed its group
