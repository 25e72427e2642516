"""One rank of the multi-rank tests (test_parallel.py): the torch.distributed group is formed
with the platform's backend, "hccl" (on this machine the emulation's, carried by gloo)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _platform(emulated: bool):  # noqa: ANN202
    if emulated:
        sys.path.insert(0, str(HERE / "npu_emulation"))
        import ascend_emulation

        ascend_emulation.install("A3")
        return ascend_emulation.emulated_platform("A3")
    from infer.core.plugins import get_plugin_host

    return get_plugin_host().select("ascend")


def run(rank: int, world: int, port: int, out_dir: str, emulated: bool, cases: list[dict]) -> None:
    """For each case {name, path, tp, ep, work}: load this rank's shard on the Ascend platform
    and run the batches ``work`` (lists of (seq, tokens)) through the paged driver."""
    platform = _platform(emulated)
    import torch
    import torch.distributed as dist
    from infer.core.model.loader import load_model
    from infer.core.plugins import get_plugin_host

    sys.path.insert(0, str(HERE))
    from paged_driver import PAGE, Pages

    platform.bind_local_rank(rank, world)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(platform.dist_backend, rank=rank, world_size=world)
    out = {}
    for c in cases:
        loaded = load_model(c["path"], platform=platform, host=get_plugin_host(), dtype="float16",
                            page_size=PAGE, skip_tokenizer_init=True, progress=False,
                            tp_size=c["tp"], tp_rank=rank, ep_size=c["ep"])
        pages = Pages(loaded, torch.device(platform.torch_device))
        out[c["name"]] = [torch.cat(pages.step(batch)) for batch in c["work"]]
    gathered = loaded.ctx.comm.all_gather(torch.full((2, 1), float(rank),
                                                     device=platform.torch_device), dim=-1)
    out["_all_gather"] = gathered.cpu()
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()
