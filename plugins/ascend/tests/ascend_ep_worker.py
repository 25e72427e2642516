"""One rank of the multi-rank tests (test_parallel.py): the torch.distributed group is formed
with the platform's backend, "hccl" (on this machine the emulation's, carried by gloo)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _platform(emulated: bool, world: int):  # noqa: ANN202
    if emulated:
        sys.path.insert(0, str(HERE / "npu_emulation"))
        import ascend_emulation

        torch_npu = ascend_emulation.install("A3")
        torch_npu.npu.DEVICE["count"] = max(torch_npu.npu.DEVICE["count"], world)  # one per rank
        return ascend_emulation.emulated_platform("A3")
    from infer.core.plugins import get_plugin_host

    return get_plugin_host().select("ascend")


def rank_tokens(world: int, hidden: int) -> list[Any]:
    """Every rank's own tokens for SparseMoE.forward_rank_tokens: 1, 2 or 3 rows per rank."""
    import torch

    g = torch.Generator().manual_seed(7)
    return [torch.randn(1 + r % 3, hidden, generator=g) for r in range(world)]


def run(rank: int, world: int, port: int, out_dir: str, emulated: bool, cases: list[dict],
        done: Any) -> None:
    """For each case {name, path, tp, ep, quantization, work, generation (optional: the emulated
    chip for this case), rank_tokens (optional: also run the first MoE layer's
    forward_rank_tokens on ``rank_tokens(world, hidden)[rank]``)}: load this rank's shard on the Ascend platform
    and run the batches ``work`` (lists of (seq, tokens)) through the paged driver; the
    number of MC2 dispatch calls each case made is saved beside its logits.

    Teardown: ``done`` (a multiprocessing Barrier of the ``world`` ranks, outside the process
    group) is passed once every rank has finished its last collective and saved its results, and
    again once every rank has destroyed its group. Without it a rank that finished first tore its
    group down and exited (closing its gloo connections, and on rank 0 the TCPStore server the
    group was formed through) while a rank slowed by a loaded machine could still be completing
    its last collective or destroying its group; an error raised there in gloo's or the store's
    native threads ends the process with SIGABRT. That is the likely cause of the abort seen
    once at the end of test_two_ranks_match_one; it did not recur here (3 runs under two busy
    loops before this change, nor in small gloo programs whose ranks exit at different times),
    so the handshake removes the window rather than a reproduced failure."""
    platform = _platform(emulated, world)
    import torch
    import torch.distributed as dist
    from infer.core.model.loader import load_model
    from infer.core.plugins import get_plugin_host

    sys.path.insert(0, str(HERE))
    from paged_driver import PAGE, Pages

    platform.bind_local_rank(rank, world)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(platform.dist_backend, rank=rank, world_size=world)
    import torch_npu

    mc2_calls = []  # every MC2 dispatch this rank makes (the runner's expert-parallel hook)
    dispatch = torch_npu.npu_moe_distribute_dispatch

    def counting_dispatch(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        mc2_calls.append(1)
        return dispatch(*args, **kwargs)

    torch_npu.npu_moe_distribute_dispatch = counting_dispatch
    out = {}
    for c in cases:
        if emulated and c.get("generation"):  # the chip the case emulates (A2 / A3)
            import ascend_emulation

            ascend_emulation.install(c["generation"])
        before = len(mc2_calls)
        loaded = load_model(c["path"], platform=platform, host=get_plugin_host(), dtype="float16",
                            quantization=c["quantization"], page_size=PAGE,
                            skip_tokenizer_init=True, progress=False,
                            tp_size=c["tp"], tp_rank=rank, ep_size=c["ep"])
        pages = Pages(loaded, torch.device(platform.torch_device))
        out[c["name"]] = [torch.cat(pages.step(batch)) for batch in c["work"]]
        if c.get("rank_tokens"):  # the first MoE layer on tokens that differ per rank
            from infer.core.model.layers.moe import SparseMoE

            moe = next(m for m in loaded.model.modules() if isinstance(m, SparseMoE))
            mine = rank_tokens(world, moe.w13.shape[2])[rank].to(moe.w13.dtype)
            with torch.inference_mode():
                out[c["name"] + "_rank_tokens"] = moe.forward_rank_tokens(mine).cpu()
        out[c["name"] + "_mc2_calls"] = len(mc2_calls) - before
    gathered = loaded.ctx.comm.all_gather(torch.full((2, 1), float(rank),
                                                     device=platform.torch_device), dim=-1)
    out["_all_gather"] = gathered.cpu()
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    done.wait(timeout=300)  # every rank is past its last collective
    dist.destroy_process_group()
    done.wait(timeout=300)  # every rank has destroyed its group: the store may go
