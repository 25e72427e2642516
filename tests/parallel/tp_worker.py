"""What each rank runs in the parallel tests (imported by name in spawned children, see ranks.py):
load a checkpoint with this rank's shard and run the test-only paged driver on it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import torch
from driver import PagedDriver, run_greedy  # tests/model/driver.py


def load(path: str, *, tp_size: int = 1, tp_rank: int = 0, ep_size: int = 1, **kw: Any) -> Any:
    from infer.core.model.loader import load_model
    from infer.core.plugins import get_plugin_host

    host = get_plugin_host()
    kw.setdefault("dtype", "float32")
    return load_model(path, platform=host.select("cpu"), host=host, skip_tokenizer_init=True,
                      progress=False, tp_size=tp_size, tp_rank=tp_rank, ep_size=ep_size, **kw)


def rank_driver(loaded: Any, page_size: int, num_pages: int = 512) -> PagedDriver:
    """A PagedDriver whose KV cache holds this rank's KV heads."""
    local = loaded.ctx.attn_backend.config.num_kv_heads
    view = SimpleNamespace(arch=dataclasses.replace(loaded.arch, num_kv_heads=local),
                           model=loaded.model, ctx=loaded.ctx)
    return PagedDriver(view, page_size, num_pages)


def greedy(loaded: Any, prompts: list[list[int]], max_new: int, page_size: int, chunk: int,
           num_pages: int = 512) -> tuple[list[list[int]], list[torch.Tensor]]:
    return run_greedy(rank_driver(loaded, page_size, num_pages), prompts, max_new, chunk=chunk)


def greedy_on_rank(rank: int, world: int, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """For each case {name, path, prompts, max_new, page_size, chunk, ep_size, load_kw}: this
    rank's greedy tokens and logits with tp_size = world."""
    out = {}
    for c in cases:
        loaded = load(c["path"], tp_size=world, tp_rank=rank, ep_size=c.get("ep_size", 1),
                      page_size=c["page_size"], **c.get("load_kw", {}))
        out[c["name"]] = greedy(loaded, c["prompts"], c["max_new"], c["page_size"], c["chunk"],
                                c.get("num_pages", 512))
    return out


def native_greedy_on_rank(rank: int, world: int, path: str, prompts: list[list[int]],
                          max_new: int) -> tuple[list[list[int]], set[str]]:
    """The default GGUF model at its default precision (the native block kernels) on this rank:
    greedy tokens and the kinds of linear layer it ran (``quant_kind``)."""
    from infer.core.model.layers.linear import LinearBase

    loaded = load(path, tp_size=world, tp_rank=rank, dtype="auto", page_size=16)
    kinds = {m.quant_kind for m in loaded.model.modules() if isinstance(m, LinearBase)}
    gen, _ = greedy(loaded, prompts, max_new, 16, 16, num_pages=64)
    return gen, kinds


def moe_rank_tokens(rank: int, world: int, path: str, ep_size: int) -> float:
    """A MoE layer fed different tokens on each rank (counts 5 and 9) through
    ``forward_rank_tokens`` against the one-rank layer on the same tokens: max relative error."""
    full = load(path, page_size=4)  # one rank: its communicator is the identity
    split = load(path, tp_size=world, tp_rank=rank, ep_size=ep_size, page_size=4)

    def moe(loaded: Any) -> Any:
        return next(m for m in loaded.model.modules() if hasattr(m, "forward_rank_tokens"))

    x = torch.randn(5 + 4 * rank, full.arch.hidden_size,
                    generator=torch.Generator().manual_seed(rank))
    with torch.no_grad():
        ref = moe(full)(x)
        got = moe(split).forward_rank_tokens(x)
    return ((got - ref).abs().max() / ref.abs().max()).item()
