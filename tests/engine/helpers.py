"""Driving an EngineCore to completion in tests."""

from __future__ import annotations

import random


def random_prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 60, vocab: int = 300) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def run_all(core, prompts, params=None, stagger: int = 0, check_pool: bool = True, **req_kwargs):
    """Submit prompts (all at once, or one every ``stagger`` steps) and step until done.
    Returns {rid: (output ids, last RequestOutput)}."""
    params = params or {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    out: dict[str, list[int]] = {}
    last = {}
    pending = [(f"r{i}", p) for i, p in enumerate(prompts)]
    step = 0
    while pending or core.has_work():
        if pending and (stagger == 0 or step % stagger == 0):
            batch = pending if stagger == 0 else pending[:1]
            for rid, p in batch:
                core.add_request(core.make_request(rid, p, params, **req_kwargs))
            pending = pending[len(batch):]
        for o in core.step():
            out.setdefault(o.rid, []).extend(o.new_token_ids)
            last[o.rid] = o
        step += 1
        assert step < 100000
    if check_pool:
        s = core.stats()
        assert s.pages_free + s.pages_cached == s.pages_total, "pages leaked"
        assert s.running == 0 and s.queued == 0
    return {rid: (ids, last[rid]) for rid, ids in out.items()}
