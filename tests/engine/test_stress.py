"""Random add / abort / step sequences on a tiny pool: no page leaks, no hangs, and every request
that was not aborted produces exactly its unbatched greedy output."""

from __future__ import annotations

import random

import pytest
from helpers import random_prompts, run_all

PARAMS = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
PROMPTS = random_prompts(24, seed=21, lo=2, hi=50)


@pytest.fixture(scope="module")
def reference(make_core):
    core = make_core()
    return [run_all(core, [p], PARAMS)["r0"][0] for p in PROMPTS]


@pytest.mark.parametrize("seed,flags", [
    (0, {"max_total_tokens": 120, "page_size": 2, "chunked_prefill_size": 16}),
    (1, {"max_total_tokens": 96, "page_size": 1, "chunked_prefill_size": -1,
         "enable_mixed_chunk": True, "enable_priority_scheduling": True,
         "priority_scheduling_preemption_threshold": 0, "max_running_requests": 4}),
    (2, {"max_total_tokens": 160, "page_size": 4, "chunked_prefill_size": 8,
         "schedule_policy": "lpm", "disable_radix_cache": True}),
])
def test_random_traffic(make_core, reference, seed, flags):
    rng = random.Random(seed)
    core = make_core(**flags)
    outputs: dict[str, list[int]] = {}
    aborted: set[str] = set()
    finished: set[str] = set()
    todo = list(range(len(PROMPTS)))
    steps = 0
    while todo or core.has_work():
        if todo and rng.random() < 0.4:
            i = todo.pop(0)
            core.add_request(core.make_request(f"r{i}", PROMPTS[i], PARAMS, priority=rng.randrange(3)))
        if rng.random() < 0.08:
            live = [r for r in core.table.reqs if r not in finished]
            if live:
                rid = rng.choice(live)
                assert core.abort(rid)
                aborted.add(rid)
        for o in core.step():
            assert o.rid not in finished, "output after the finish"
            outputs.setdefault(o.rid, []).extend(o.new_token_ids)
            if o.finished:
                finished.add(o.rid)
                assert (o.finish_reason["type"] == "abort") == (o.rid in aborted)
        s = core.stats()
        held = sum(len(r.pages) - r.num_prefix_pages for r in core.scheduler.running)
        assert s.pages_free + s.pages_cached + held == s.pages_total
        steps += 1
        assert steps < 5000, "the engine stopped making progress"
    assert finished == {f"r{i}" for i in range(len(PROMPTS))}
    for i in range(len(PROMPTS)):
        if f"r{i}" not in aborted:
            assert outputs[f"r{i}"] == reference[i], f"r{i}"
    s = core.stats()
    assert s.pages_free + s.pages_cached == s.pages_total
