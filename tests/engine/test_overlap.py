"""Overlap scheduling (the next batch is scheduled and launched before the last one's sampled ids
reach the host) gives exactly the outputs of the plain order: greedy and seeded sampling, stop
tokens and strings, logprobs, retraction, chunked prefill, aborts, n > 1, and requests that force
a synchronous step (grammar, penalties). On the CPU overlap is off by default, so these tests
turn it on explicitly."""

from __future__ import annotations

import random

import pytest
from helpers import random_prompts, run_all

PROMPTS = random_prompts(12, seed=5, lo=3, hi=60)
GREEDY = {"max_new_tokens": 9, "temperature": 0, "ignore_eos": True}


def both(make_core, prompts=PROMPTS, params=GREEDY, stagger=0, req_kwargs=None, **flags):
    """(plain, overlap) outputs {rid: (ids, last output)} and the overlap core."""
    req_kwargs = req_kwargs or {}
    plain = run_all(make_core(disable_overlap_schedule=True, **flags), prompts, params, stagger,
                    **req_kwargs)
    core = make_core(disable_overlap_schedule=False, **flags)
    assert core.overlap
    return plain, run_all(core, prompts, params, stagger, **req_kwargs), core


def ids(res):
    return {rid: toks for rid, (toks, _) in res.items()}


def test_cpu_default_is_off_and_tokens_arrive_one_step_later(make_core):
    assert not make_core().overlap  # the CPU platform's default: nothing to overlap with
    for overlap, first_step_tokens in ((False, 1), (True, 0)):
        core = make_core(disable_overlap_schedule=not overlap)
        core.add_request(core.make_request("a", PROMPTS[0], GREEDY))
        got = sum(len(o.new_token_ids) for o in core.step())  # the prefill step
        assert got == first_step_tokens
        assert (core._inflight is not None) == overlap
        got += sum(len(o.new_token_ids) for o in core.step())
        assert got == first_step_tokens + 1


@pytest.mark.parametrize("flags,stagger", [
    ({}, 0),
    ({"chunked_prefill_size": 8, "page_size": 4}, 3),
    ({"max_total_tokens": 160, "page_size": 2, "chunked_prefill_size": 32}, 0),  # retraction
    ({"enable_mixed_chunk": True, "chunked_prefill_size": 16}, 2),
    ({"max_running_requests": 3, "disable_radix_cache": True}, 1),
])
def test_greedy_identical(make_core, flags, stagger):
    plain, over, core = both(make_core, stagger=stagger, **flags)
    assert ids(over) == ids(plain)
    assert all(len(t) == GREEDY["max_new_tokens"] for t in ids(over).values())
    for rid, (_, last) in over.items():
        assert last.finish_reason == plain[rid][1].finish_reason
        assert last.completion_tokens == GREEDY["max_new_tokens"]
    if flags.get("max_total_tokens") == 160:
        assert core.stats().num_retractions > 0


def test_seeded_sampling_and_logprobs_identical(make_core):
    params = {"max_new_tokens": 7, "temperature": 0.9, "top_p": 0.9, "top_k": 40, "seed": 3,
              "ignore_eos": True}
    plain, over, _ = both(make_core, params=params,
                          req_kwargs={"return_logprob": True, "top_logprobs_num": 3})
    assert ids(over) == ids(plain)
    for rid, (_, last) in over.items():
        ref = plain[rid][1]
        assert last.output_logprobs == pytest.approx(ref.output_logprobs, abs=1e-6)
        assert [[t for t, _ in row] for row in last.output_top_logprobs] == \
            [[t for t, _ in row] for row in ref.output_top_logprobs]


def test_stop_tokens_end_at_the_same_place(make_core):
    """A stop token sampled at step N is known only after step N+1 was launched: the extra row
    is discarded, and neither the outputs nor the page accounting (run_all checks) change."""
    free = ids(run_all(make_core(), PROMPTS, GREEDY))
    prompts, stops = [], []
    for i, p in enumerate(PROMPTS):
        toks = free[f"r{i}"]
        prompts.append(p)
        stops.append(toks[2 + i % 4])  # stops somewhere in the middle
    plain_core = make_core(disable_overlap_schedule=True)
    over_core = make_core(disable_overlap_schedule=False)
    for core in (plain_core, over_core):
        for i, p in enumerate(prompts):
            core.add_request(core.make_request(
                f"r{i}", p, {"max_new_tokens": 9, "temperature": 0, "stop_token_ids": [stops[i]]}))
    results = []
    for core in (plain_core, over_core):
        out, last = {}, {}
        while core.has_work():
            for o in core.step():
                out.setdefault(o.rid, []).extend(o.new_token_ids)
                last[o.rid] = o.finish_reason
        s = core.stats()
        assert s.pages_free + s.pages_cached == s.pages_total and s.running == 0
        results.append((out, last))
    assert results[1] == results[0]
    assert all(r == {"type": "stop", "matched": stops[int(k[1:])]} for k, r in results[1][1].items())


def test_stop_strings_identical(make_core):
    params = {"max_new_tokens": 12, "temperature": 0, "stop": ["e", "a"]}
    plain, over, _ = both(make_core, params=params)
    assert ids(over) == ids(plain)
    assert {r: last.finish_reason for r, (_, last) in over.items()} == \
        {r: last.finish_reason for r, (_, last) in plain.items()}


def test_synchronous_requests_mixed_in(make_core):
    """Penalties and grammar need the token values on the host before the next step: their
    batches resolve at once, next to deferred ones, with unchanged results."""
    plain_core = make_core(disable_overlap_schedule=True)
    over_core = make_core(disable_overlap_schedule=False)
    kinds = [GREEDY,
             {"max_new_tokens": 9, "temperature": 0, "ignore_eos": True, "repetition_penalty": 1.3},
             {"max_new_tokens": 9, "temperature": 0, "ignore_eos": True, "frequency_penalty": 0.5},
             {"max_new_tokens": 8, "temperature": 0, "json_schema": '{"type": "integer"}'}]
    results = []
    for core in (plain_core, over_core):
        out = {}
        for step in range(200):
            if step < len(PROMPTS):
                core.add_request(core.make_request(f"r{step}", PROMPTS[step], kinds[step % 4]))
            for o in core.step():
                out.setdefault(o.rid, []).extend(o.new_token_ids)
            if step >= len(PROMPTS) and not core.has_work():
                break
        results.append(out)
    assert results[1] == results[0]
    assert len(results[1]) == len(PROMPTS)


def test_abort_while_a_step_is_in_flight(make_core):
    rng = random.Random(0)
    core = make_core(disable_overlap_schedule=False, max_total_tokens=200, page_size=2)
    ref = ids(run_all(make_core(), PROMPTS, GREEDY))
    for i, p in enumerate(PROMPTS):
        core.add_request(core.make_request(f"r{i}", p, GREEDY))
    out, reasons, aborted = {}, {}, set()
    steps = 0
    while core.has_work():
        for o in core.step():
            out.setdefault(o.rid, []).extend(o.new_token_ids)
            assert o.rid not in reasons, "reported after it finished"
            if o.finished:
                reasons[o.rid] = o.finish_reason
        steps += 1
        if core._inflight is not None and rng.random() < 0.3 and len(aborted) < 4:
            live = [r.rid for r in core._inflight.reqs if not r.finished]
            if live:
                rid = rng.choice(live)
                assert core.abort(rid)
                aborted.add(rid)
    assert aborted and len(reasons) == len(PROMPTS)
    for rid, toks in out.items():
        if rid in aborted:
            assert reasons[rid]["type"] == "abort"
            assert toks == ref[rid][:len(toks)] and all(t >= 0 for t in toks)
        else:
            assert toks == ref[rid]
    s = core.stats()
    assert s.pages_free + s.pages_cached == s.pages_total and s.running == 0


def test_n_choices_identical(make_core):
    params = {"max_new_tokens": 6, "temperature": 0.8, "seed": 11, "n": 3, "ignore_eos": True}
    plain, over, _ = both(make_core, prompts=PROMPTS[:4], params=params)
    assert ids(over) == ids(plain) and len(over) == 12
