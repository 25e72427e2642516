"""Batching never changes greedy results, and they equal transformers' (fp32 tiny Llama)."""

from __future__ import annotations

import pytest
from helpers import random_prompts, run_all
from tiny import hf_greedy

NEW = 8
PROMPTS = random_prompts(16, seed=1, lo=3, hi=70)


@pytest.fixture(scope="module")
def reference(tiny_model):
    _, hf = tiny_model
    return {f"r{i}": hf_greedy(hf, p, NEW) for i, p in enumerate(PROMPTS)}


def outputs(core, **kw):
    return {rid: ids for rid, (ids, _) in run_all(core, PROMPTS, **kw).items()}


def test_all_together_matches_transformers(make_core, reference):
    assert outputs(make_core()) == reference


def test_one_by_one(make_core, reference):
    core = make_core()
    for i, p in enumerate(PROMPTS):
        got = run_all(core, [p])["r0"][0]
        assert got == reference[f"r{i}"]


def test_staggered_tiny_chunk_page_size(make_core, reference):
    core = make_core(chunked_prefill_size=8, page_size=4)
    assert outputs(core, stagger=3) == reference


def test_retraction_under_a_tiny_pool(make_core, reference):
    # 16 requests of up to ~77 tokens in a pool of 160 tokens: decode must retract and resume
    core = make_core(max_total_tokens=160, page_size=2, chunked_prefill_size=32)
    got = outputs(core)
    assert got == reference
    assert core.stats().num_retractions > 0


def test_mixed_chunk_and_no_radix(make_core, reference):
    assert outputs(make_core(enable_mixed_chunk=True, chunked_prefill_size=16), stagger=2) == reference
    assert outputs(make_core(disable_radix_cache=True, chunked_prefill_size=16)) == reference


def test_limits_do_not_change_outputs(make_core, reference):
    core = make_core(max_running_requests=3, prefill_max_requests=2, max_prefill_tokens=64,
                     schedule_conservativeness=2.0)
    assert outputs(core) == reference


def test_prefix_cache_hits(make_core, tiny_model):
    _, hf = tiny_model
    prefix = random_prompts(1, seed=7, lo=200, hi=201)[0]
    a, b = prefix + [5, 6, 7], prefix + [9, 10]
    core = make_core(page_size=4)
    run_all(core, [a])
    res = run_all(core, [b])["r0"]
    assert res[1].cached_tokens >= 192
    assert core.stats().prefix_cache_hit_rate > 0.4
    plain = run_all(make_core(disable_radix_cache=True), [b])["r0"]
    assert plain[1].cached_tokens == 0
    assert res[0] == plain[0] == hf_greedy(hf, b, NEW)
