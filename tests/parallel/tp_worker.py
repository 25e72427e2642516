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
                          max_new: int) -> dict[str, Any]:
    """The default GGUF model at its default precision (the native block kernels) on this rank:
    the kinds of linear layer it ran (``quant_kind``), and greedy tokens and logits through the
    per-op path and through the native decode graph (its decode steps in one native call)."""
    from infer.core.model.layers.linear import LinearBase

    loaded = load(path, tp_size=world, tp_rank=rank, dtype="auto", page_size=16)
    kinds = {m.quant_kind for m in loaded.model.modules() if isinstance(m, LinearBase)}
    per_op = greedy(loaded, prompts, max_new, 16, 16, num_pages=64)
    driver, graph, counts = graph_driver(loaded, 16, 64)
    graph_run = run_greedy(driver, prompts, max_new, chunk=16)
    return {"kinds": kinds, "per_op": per_op, "graph": graph_run, "graph_steps": counts["graph"],
            "route": graph.all_reduce_route}


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


def graph_driver(loaded: Any, page_size: int, num_pages: int, comm: Any = None
                 ) -> tuple[PagedDriver, Any, dict[str, int]]:
    """A PagedDriver whose steps run the CPU plugin's native decode graph (``infer_cpu.graph``),
    captured on this rank's shard, where it takes them (decode, prefill and extend steps);
    other steps run the per-op model.
    ``comm``: the communicator the graph's all-reduce uses (default the model's). Returns the
    driver, the graph and a counter of the steps it ran."""
    from infer_cpu.graph import NativeDecodeGraph

    driver = rank_driver(loaded, page_size, num_pages)
    ctx = loaded.ctx if comm is None else dataclasses.replace(loaded.ctx, comm=comm)
    graph = NativeDecodeGraph(SimpleNamespace(model=loaded.model, kv_cache=driver.kv,
                                              loaded=SimpleNamespace(ctx=ctx)), None)
    graph.capture()
    assert graph.ok, graph.reason
    counts = {"graph": 0}

    def forward(fwd: Any) -> torch.Tensor:
        if graph.can_run(fwd):
            counts["graph"] += 1
            return graph.run(fwd)
        return loaded.model(fwd)

    driver.loaded.model = forward
    return driver, graph, counts


def graph_greedy_on_rank(rank: int, world: int, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """For each case {name, path, prompts, max_new, page_size, chunk, route}: greedy tokens and
    logits through the native decode graph at tp_size = world, with the graph's all-reduce on
    the route asked for ("native": the communicator's C all-reduce, "callback": a plain gloo
    communicator called back from C), the route it took and how many steps the graph ran; and
    ("per_op", the per-op path on the same shard) for comparison."""
    from infer.core.ops.comm import ProcessGroupCommunicator

    out = {}
    for c in cases:
        loaded = load(c["path"], tp_size=world, tp_rank=rank, dtype="auto",
                      page_size=c["page_size"])
        comm = ProcessGroupCommunicator(world, rank) if c["route"] == "callback" else None
        driver, graph, counts = graph_driver(loaded, c["page_size"], 128, comm)
        gen, logits = run_greedy(driver, c["prompts"], c["max_new"], chunk=c["chunk"])
        per_op = greedy(loaded, c["prompts"], c["max_new"], c["page_size"], c["chunk"], 128)
        out[c["name"]] = {"gen": gen, "logits": logits, "route": graph.all_reduce_route,
                          "graph_steps": counts["graph"], "per_op": per_op}
    return out


def graph_peer_exits(rank: int, world: int, path: str) -> dict[str, str]:
    """Rank 1 exits in the middle of a decode step: it joins the step's first collective (the
    vocabulary-parallel embedding's all-reduce, before the native call) and exits, so rank 0's
    native call finds it gone at the all-reduce after the first layer's attention. Rank 0 must
    raise from the graph's run, naming rank 1, not hang."""
    import os
    import traceback

    loaded = load(path, tp_size=world, tp_rank=rank, dtype="auto", page_size=4)
    driver, graph, counts = graph_driver(loaded, 4, 32)
    driver.step([(0, [1, 2, 3])])  # prefill (the graph too, collectives over shared memory)
    if rank == 1:
        loaded.ctx.comm.all_reduce(torch.zeros(1, loaded.arch.hidden_size))
        os._exit(0)
    try:
        driver.step([(0, [4])])
    except RuntimeError as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return {"route": graph.all_reduce_route, "error": str(exc), "raised_in": where.name,
                "file": where.filename, "graph_steps": str(counts["graph"])}
    return {"error": "no error"}
