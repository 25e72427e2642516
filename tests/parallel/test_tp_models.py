"""Tensor and expert parallelism against one rank, with real processes: every architecture's tiny
fp32 checkpoint run on 2 ranks (spawned, gloo, one thread each) gives the logits of the
single-rank model within 1e-4 (relative to the largest logit) on every rank, through prefill,
chunked prefill and decode rows, and the same greedy tokens. ``llama_mqa`` has one KV head, so
its KV head is replicated on both ranks, and MLP biases (the row-parallel down projection's bias
is added once); the MoE models also run with ep=2 (experts split)."""

from __future__ import annotations

import pytest
import torch
from hf_tiny import save_tiny  # tests/model (ranks.py puts it on sys.path)
from ranks import run_ranks
from tp_worker import greedy, greedy_on_rank, load

ARCHS = ["llama", "llama_tied", "llama_mqa", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe"]
EP_ARCHS = ["mixtral", "qwen3_moe"]
PROMPT_LENS = [5, 13, 22]
MAX_NEW = 12
PAGE, CHUNK = 4, 7
MQA_BIAS = {"num_key_value_heads": 1, "mlp_bias": True}  # replicated KV head, row-parallel bias


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One spawn of 2 ranks runs every case (tp=2, and tp=2 ep=2 for the MoE models)."""
    cases = []
    for arch in ARCHS:
        path = tmp_path_factory.mktemp(arch)
        hf = save_tiny("llama" if arch == "llama_mqa" else arch, path,
                       **(MQA_BIAS if arch == "llama_mqa" else {}))
        if arch == "llama_mqa":  # transformers initialises biases to zero
            with torch.no_grad():
                for name, p in hf.named_parameters():
                    if name.endswith(".bias"):
                        p.normal_(0, 0.5, generator=torch.Generator().manual_seed(2))
            hf.save_pretrained(path)
        gen = torch.Generator().manual_seed(1)
        prompts = [torch.randint(0, hf.config.vocab_size, (n,), generator=gen).tolist()
                   for n in PROMPT_LENS]
        base = {"path": str(path), "prompts": prompts, "max_new": MAX_NEW, "page_size": PAGE,
                "chunk": CHUNK}
        cases.append({**base, "name": arch})
        if arch in EP_ARCHS:
            cases.append({**base, "name": f"{arch}_ep2", "ep_size": 2})
    results = run_ranks(greedy_on_rank, 2, cases)
    return {c["name"]: c for c in cases}, results


@pytest.mark.parametrize("name", ARCHS + [f"{a}_ep2" for a in EP_ARCHS])
def test_two_ranks_match_one(runs, name):
    cases, results = runs
    case = cases[name]
    ref_gen, ref_logits = greedy(load(case["path"], page_size=PAGE), case["prompts"], MAX_NEW,
                                 PAGE, CHUNK)
    for rank, by_case in enumerate(results):
        gen, logits = by_case[name]
        for i in range(len(case["prompts"])):
            assert logits[i].shape == ref_logits[i].shape
            err = rel_err(logits[i], ref_logits[i])
            assert err < 1e-4, f"{name} rank {rank} seq {i}: relative logits error {err:.2e}"
        assert gen == ref_gen, f"{name} rank {rank}: greedy tokens differ from one rank"
    # the ranks' results are replicated exactly (identical all-reduce results on every rank)
    for (g0, l0), (g1, l1) in [(results[0][name], results[1][name])]:
        assert g0 == g1 and all(torch.equal(a, b) for a, b in zip(l0, l1, strict=True))


@pytest.mark.parametrize("ep", [1, 2])
def test_moe_with_different_tokens_per_rank(runs, ep):
    """Dispatch by all-gather and combine by reduce-scatter (ranks holding their own tokens)."""
    from tp_worker import moe_rank_tokens

    cases, _ = runs
    errs = run_ranks(moe_rank_tokens, 2, cases["mixtral"]["path"], ep)
    assert max(errs) < 1e-5, errs
