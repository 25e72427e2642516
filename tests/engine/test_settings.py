"""Engine settings not covered elsewhere: pool sizing, grammar backend, policies end to end."""

from __future__ import annotations

import pytest
from helpers import random_prompts, run_all
from infer.core.cache.page_pool import kv_bytes_per_token


def test_pool_from_mem_fraction_static(make_core):
    probe = make_core(max_total_tokens=64)
    arch, platform = probe.arch, probe.platform
    weights = sum(p.numel() * p.element_size() for p in probe.loaded.model.parameters())
    per_token = kv_bytes_per_token(arch.num_layers, arch.num_kv_heads, arch.head_dim,
                                   arch.kv_dtype.itemsize)
    budget = 3000 * per_token  # ask for room for 3000 tokens after the weights
    frac = (weights + budget) / platform.memory_available()
    core = make_core(max_total_tokens=None, mem_fraction_static=frac, page_size=4)
    tokens = core.pool.capacity * 4
    assert abs(tokens - 3000) <= 8
    assert probe.pool.capacity == 64
    with pytest.raises(ValueError, match="mem_fraction_static"):
        make_core(max_total_tokens=None, mem_fraction_static=1e-12)


def test_grammar_backend_none_refuses_constraints(make_core):
    core = make_core(grammar_backend="none")
    with pytest.raises(ValueError, match="grammar"):
        core.add_request(core.make_request("g", [5, 6], {"regex": "[a-z]+"}))


def test_ebnf_constraint(make_core):
    core = make_core()
    res = run_all(core, [[5, 6, 7]], {"max_new_tokens": 20, "temperature": 1.0, "seed": 2,
                                      "ebnf": 'root ::= "yes" | "no"'})["r0"]
    assert core.tokenizer.decode(res[0], skip_special_tokens=True) in ("yes", "no")
    assert res[1].finish_reason["type"] == "stop"


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "dfs-weight", "lof", "random", "priority"])
def test_every_policy_end_to_end_gives_the_same_greedy_outputs(make_core, policy):
    prompts = random_prompts(6, seed=4)
    base = run_all(make_core(), prompts)
    got = run_all(make_core(schedule_policy=policy, max_running_requests=2,
                            radix_eviction_policy="lfu"), prompts)
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in base.items()}


def test_random_seed_makes_unseeded_sampling_reproducible(make_core):
    p = {"max_new_tokens": 10, "temperature": 1.5, "ignore_eos": True}
    prompts = random_prompts(2, seed=6)
    a = run_all(make_core(random_seed=7), prompts, p)
    b = run_all(make_core(random_seed=7), prompts, p)
    c = run_all(make_core(random_seed=8), prompts, p)
    assert {k: v[0] for k, v in a.items()} == {k: v[0] for k, v in b.items()}
    assert {k: v[0] for k, v in a.items()} != {k: v[0] for k, v in c.items()}


def test_prompt_logprobs_with_chunked_prefill_and_prefix_cache(make_core):
    prompt = random_prompts(1, seed=12, lo=30, hi=31)[0]

    def prompt_lps(core):
        core.add_request(core.make_request("x", prompt, {"max_new_tokens": 1},
                                           return_logprob=True, logprob_start_len=0))
        outs = []
        while core.has_work():
            outs.extend(core.step())
        return next(o.prompt_logprobs for o in outs if o.prompt_logprobs is not None)

    whole = prompt_lps(make_core())
    core = make_core(chunked_prefill_size=8, page_size=2)
    chunked = prompt_lps(core)
    again = prompt_lps(core)  # the prompt is cached now, logprobs still need every position
    assert len(whole) == len(chunked) == len(again) == 30
    for (t1, a), (t2, b), (t3, c) in zip(whole, chunked, again, strict=True):
        assert t1 == t2 == t3
        assert (a is None) == (b is None) == (c is None)
        if a is not None:
            assert abs(a - b) < 1e-3 and abs(a - c) < 1e-3
