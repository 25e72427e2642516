"""Scheduling policies, priorities, preemption, queue limits and abort (no model: the test plays
the model runner by appending a token to every sampled sequence)."""

from __future__ import annotations

import pytest
from infer.core.cache.manager import KVManager
from infer.core.cache.page_pool import PagePool
from infer.core.cache.radix_cache import RadixCache
from infer.core.engine.request import QueueFullError, Request, RequestState
from infer.core.engine.scheduler import Scheduler, SchedulerConfig
from infer.core.sampling.params import SamplingParams


def make(num_pages=512, page_size=1, **cfg):
    pool = PagePool(num_pages, page_size)
    kv = KVManager(pool, RadixCache(pool))
    return Scheduler(SchedulerConfig(**cfg), kv)


def req(rid, ids, max_new=4, priority=0):
    return Request(rid=rid, prompt_ids=list(ids), params=SamplingParams(max_new_tokens=max_new),
                   priority=priority)


def step(s):
    """One scheduler step with a fake model; returns the rids in the batch."""
    b = s.schedule()
    if b is None:
        return []
    for q in b.seqs:
        if q.sample:
            q.req.output_ids.append(7)
    s.update(b)
    for q in b.seqs:
        r = q.req
        if r.state is RequestState.RUNNING and len(r.output_ids) >= r.params.max_new_tokens:
            s.finish(r)
            r.finish({"type": "length"})
    return [q.req.rid for q in b.seqs]


def admission_order(s, reqs):
    for r in reqs:
        s.add(r)
    order = []
    while s.waiting:
        for rid in step(s):
            if rid not in order:
                order.append(rid)
    return order


def test_fcfs():
    s = make(prefill_max_requests=1)
    assert admission_order(s, [req(f"r{i}", [i + 1] * 5) for i in range(4)]) == ["r0", "r1", "r2", "r3"]


def test_lpm_prefers_longest_cached_prefix():
    s = make(prefill_max_requests=1, schedule_policy="lpm")
    warm = req("warm", [1, 2, 3, 4, 5, 6, 7, 8], max_new=1)
    s.add(warm)
    while s.has_work():
        step(s)
    reqs = [req("none", [9, 9, 9, 9]), req("short", [1, 2, 3, 0, 0]), req("long", [1, 2, 3, 4, 5, 6, 0])]
    assert admission_order(s, reqs)[:3] == ["long", "short", "none"]


def test_dfs_weight_groups_shared_prefixes_heaviest_first():
    s = make(prefill_max_requests=1, schedule_policy="dfs-weight")
    reqs = [req("b1", [2, 2, 1]), req("a1", [1, 1, 1]), req("b2", [2, 2, 2]), req("a2", [1, 1, 2]),
            req("a3", [1, 1, 3]), req("c", [3])]
    assert admission_order(s, reqs) == ["a1", "a2", "a3", "b1", "b2", "c"]


def test_lof_longest_output_first():
    s = make(prefill_max_requests=1, schedule_policy="lof")
    reqs = [req("s", [1, 2], max_new=2), req("l", [3, 4], max_new=20), req("m", [5, 6], max_new=8)]
    assert admission_order(s, reqs) == ["l", "m", "s"]


def test_random_is_seeded_and_not_fcfs():
    orders = []
    for seed in (0, 0, 1, 2, 3):
        s = make(prefill_max_requests=1, schedule_policy="random", random_seed=seed)
        orders.append(admission_order(s, [req(f"r{i}", [i + 1] * 3) for i in range(6)]))
    assert orders[0] == orders[1]
    assert any(o != [f"r{i}" for i in range(6)] for o in orders)
    assert all(sorted(o) == sorted(orders[0]) for o in orders)


@pytest.mark.parametrize("low_first,expected", [(False, ["hi", "mid", "lo"]), (True, ["lo", "mid", "hi"])])
def test_priority_order(low_first, expected):
    s = make(prefill_max_requests=1, enable_priority_scheduling=True,
             schedule_low_priority_values_first=low_first)
    reqs = [req("lo", [1, 1], priority=1), req("mid", [2, 2], priority=5), req("hi", [3, 3], priority=9)]
    assert admission_order(s, reqs) == expected


@pytest.mark.parametrize("prio,preempted", [(50, True), (5, False)])
def test_priority_preemption_threshold(prio, preempted):
    s = make(max_running_requests=1, enable_priority_scheduling=True,
             priority_scheduling_preemption_threshold=10)
    low = req("low", [1, 2, 3], max_new=50, priority=0)
    s.add(low)
    step(s)
    step(s)
    s.add(req("high", [4, 5], max_new=2, priority=prio))
    rids = step(s)
    assert ("high" in rids) is preempted
    assert (low.state is RequestState.WAITING) is preempted
    assert s.num_preemptions == int(preempted)
    while s.has_work():
        step(s)
    assert len(low.output_ids) == 50  # the preempted request resumes and completes


def test_chunked_prefill_splits_and_max_running():
    s = make(chunked_prefill_size=4, max_running_requests=2)
    r = req("a", list(range(1, 11)), max_new=1)
    s.add(r)
    sizes = []
    while s.has_work():
        b = s.schedule()
        sizes.append([q.extend_len for q in b.seqs])
        for q in b.seqs:
            if q.sample:
                q.req.output_ids.append(7)
        s.update(b)
        if r.output_ids:
            s.finish(r)
            r.finish({"type": "length"})
    assert sizes == [[4], [4], [2]]
    s2 = make(max_running_requests=2)
    for i in range(3):
        s2.add(req(f"r{i}", [i + 1] * 3, max_new=5))
    assert len(s2.schedule().seqs) == 2


def test_queue_full_and_abort():
    s = make(max_queued_requests=2)
    s.add(req("a", [1, 2]))
    s.add(req("b", [1, 3]))
    with pytest.raises(QueueFullError, match="max-queued-requests"):
        s.add(req("c", [1, 4]))
    assert s.abort("b").rid == "b"
    step(s)  # a is running
    assert s.abort("a").rid == "a"
    assert not s.has_work()
    assert s.kv.pool.num_free + s.kv.cache.cached_pages == s.kv.pool.capacity


def test_retraction_frees_and_resumes():
    s = make(num_pages=13, page_size=1, schedule_conservativeness=0.0)  # 12 usable tokens
    a, b = req("a", [1, 2, 3], max_new=6), req("b", [4, 5, 6], max_new=6)
    s.add(a)
    s.add(b)
    while s.has_work():
        step(s)
    assert s.num_retractions > 0
    assert len(a.output_ids) == 6 and len(b.output_ids) == 6
    s.kv.cache.evict(10**6)
    assert s.kv.pool.num_free == s.kv.pool.capacity


def test_schedule_conservativeness_holds_back_admission():
    def admitted(cons):
        s = make(num_pages=41, schedule_conservativeness=cons)  # 40 tokens
        a, b = req("a", [1] * 10, max_new=30), req("b", [2] * 10, max_new=30)
        s.add(a)
        step(s)
        s.add(b)
        step(s)
        return b.state is RequestState.RUNNING

    assert admitted(0.0)
    assert not admitted(1.0)  # b's prompt fits, but not with room kept for a's and b's outputs


def test_mixed_chunk_puts_decode_rows_in_prefill_batches():
    for mixed in (False, True):
        s = make(enable_mixed_chunk=mixed)
        s.add(req("a", [1, 2, 3], max_new=5))
        step(s)
        s.add(req("b", [4, 5, 6], max_new=5))
        b = s.schedule()
        assert b.is_prefill
        kinds = sorted((q.req.rid, q.extend_len) for q in b.seqs)
        assert kinds == ([("a", 1), ("b", 3)] if mixed else [("b", 3)])
