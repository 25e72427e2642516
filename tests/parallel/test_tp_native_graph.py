"""The CPU plugin's native decode graph (one native call per decode step, ``infer_cpu.graph``)
under tensor parallelism, with real processes (spawned, gloo, one thread each): each rank
captures its shard and the native call all-reduces the attention output and MLP down
projections itself. Tiny Q4_1/Q8_0 GGUF Llamas (``gguf_tiny.py``) at tp=2, one with 2 KV heads
(split) and one with 1 (replicated), give one rank's greedy tokens and float32 logits within
1e-4, on both all-reduce routes (the shared-memory communicator's C all-reduce, and a callback
from C into a plain gloo communicator); on each rank the graph gives the per-op path's logits
bit for bit (the same kernels and the same all-reduce order). A rank that dies mid-step makes
the others' native call raise, naming it."""

from __future__ import annotations

import pytest
import torch
from gguf_tiny import save_tiny_gguf
from infer_cpu import kernels
from ranks import run_ranks
from tp_worker import graph_driver, graph_greedy_on_rank, graph_peer_exits, load, run_greedy

pytestmark = pytest.mark.skipif(kernels.load() is None,
                                reason=f"native kernels unavailable: {kernels.status().detail}")

PROMPT_LENS = [5, 13, 22]
MAX_NEW = 10
PAGE, CHUNK = 4, 7
MODELS = {"kv2": {"kv_heads": 2}, "kv1_replicated": {"kv_heads": 1}}
ROUTES = {"native": "native (shared memory, in C)", "callback": "callback into "
          "ProcessGroupCommunicator.all_reduce"}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def one_rank_graph(case: dict) -> tuple[list[list[int]], list[torch.Tensor], int]:
    loaded = load(case["path"], dtype="auto", page_size=PAGE)
    driver, graph, counts = graph_driver(loaded, PAGE, 128)
    assert graph.all_reduce_route == "none (one rank)"
    gen, logits = run_greedy(driver, case["prompts"], MAX_NEW, chunk=CHUNK)
    return gen, logits, counts["graph"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cases = []
    for name, shape in MODELS.items():
        path = save_tiny_gguf(tmp_path_factory.mktemp(name) / "model.gguf", **shape)
        gen = torch.Generator().manual_seed(3)
        prompts = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in PROMPT_LENS]
        for route in ROUTES:
            cases.append({"name": f"{name}-{route}", "model": name, "route": route,
                          "path": str(path), "prompts": prompts, "max_new": MAX_NEW,
                          "page_size": PAGE, "chunk": CHUNK})
    results = run_ranks(graph_greedy_on_rank, 2, cases)
    refs = {c["model"]: one_rank_graph(c) for c in cases}
    return {c["name"]: c for c in cases}, results, refs


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("route", list(ROUTES))
def test_tp2_graph_matches_one_rank(runs, model, route):
    cases, results, refs = runs
    name = f"{model}-{route}"
    ref_gen, ref_logits, ref_steps = refs[model]
    assert ref_steps > 0
    for rank, by_case in enumerate(results):
        r = by_case[name]
        assert r["route"] == ROUTES[route], f"rank {rank}"
        assert r["graph_steps"] == ref_steps > 0, f"rank {rank}: the graph ran {r['graph_steps']}"
        for i, (got, ref) in enumerate(zip(r["logits"], ref_logits, strict=True)):
            assert got.shape == ref.shape
            err = rel_err(got, ref)
            assert err < 1e-4, f"{name} rank {rank} seq {i}: relative logits error {err:.2e}"
        assert r["gen"] == ref_gen, f"{name} rank {rank}: greedy tokens differ from one rank"
        per_op_gen, per_op_logits = r["per_op"]  # the per-op path on the same shard
        assert per_op_gen == r["gen"]
        assert all(torch.equal(a, b) for a, b in zip(r["logits"], per_op_logits, strict=True))
    a, b = results[0][name], results[1][name]
    assert all(torch.equal(x, y) for x, y in zip(a["logits"], b["logits"], strict=True))


def test_rank_dying_mid_step_is_an_error_not_a_hang(tmp_path):
    path = save_tiny_gguf(tmp_path / "model.gguf")
    r = run_ranks(graph_peer_exits, 2, str(path), timeout=120, wait_for=[0])[0]
    assert r["error"].startswith("communicator: rank 1 (pid "), r
    assert "exited during a collective" in r["error"]
    assert r["route"] == ROUTES["native"] and r["graph_steps"] == "2"  # the prefill, the decode
    assert r["raised_in"] == "run" and r["file"].endswith("graph.py"), r
