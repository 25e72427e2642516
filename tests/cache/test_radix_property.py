"""Radix cache + page pool against the naive reference, driven by random operation sequences.

A simulated request is a token list; it matches and locks its prefix, allocates private pages for
the rest, and on finish inserts its pages (freeing duplicates) and unlocks — exactly what the
engine's KVManager does. Both caches see the same operations; while nothing has been evicted
they must agree on every match length, and at every step the ownership invariant must hold:
free + cached + private == capacity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from infer.core.cache.manager import KVManager
from infer.core.cache.naive_cache import NaiveCache
from infer.core.cache.page_pool import PagePool
from infer.core.cache.plain_cache import PlainCache
from infer.core.cache.radix_cache import RadixCache


@dataclass
class Holder:
    all_ids: list[int]
    pages: list[int] = field(default_factory=list)
    num_prefix_pages: int = 0
    cache_handle: object = None
    num_computed: int = 0
    pages_dirty: int = 0


def check_invariant(kv: KVManager, live: list[Holder]) -> None:
    private = sum(len(h.pages) - h.num_prefix_pages for h in live)
    assert kv.pool.num_free + kv.cache.cached_pages + private == kv.pool.capacity
    owned = [p for h in live for p in h.pages[h.num_prefix_pages:]]
    assert len(owned) == len(set(owned)), "a private page is held twice"
    assert 0 <= kv.cache.evictable_pages <= kv.cache.cached_pages


# token alphabet of 3 so that prefixes are shared often
seqs = st.lists(st.integers(0, 2), min_size=1, max_size=24)
ops = st.lists(st.tuples(st.sampled_from(["start", "finish", "abort", "evict", "unfinished", "peek"]),
                         seqs, st.integers(0, 7)), min_size=1, max_size=40)


def run_ops(cache_cls, page_size: int, num_pages: int, operations, policy: str = "lru"):
    pool = PagePool(num_pages, page_size)
    kv = KVManager(pool, cache_cls(pool, policy) if cache_cls is not PlainCache else PlainCache(pool))
    live: list[Holder] = []
    log = []
    for op, tokens, k in operations:
        if op == "start":
            h = Holder(list(tokens))
            kv.attach_prefix(h)
            log.append(("match", h.num_computed))
            if kv.reserve(h, len(h.all_ids)):
                h.num_computed = len(h.all_ids)
                live.append(h)
            else:
                kv.release(h, cache=False)
                log.append(("oom",))
        elif op in ("finish", "abort") and live:
            h = live.pop(k % len(live))
            kv.release(h, cache=(op == "finish"))
        elif op == "unfinished" and live:
            kv.cache_unfinished(live[k % len(live)])
        elif op == "peek":
            log.append(("peek", len(kv.cache.match_prefix(tokens, touch=False).pages)))
        elif op == "evict":
            log.append(("evict", kv.cache.evict(k)))
        check_invariant(kv, live)
    for h in live:
        kv.release(h)
    check_invariant(kv, [])
    assert kv.pool.num_free + kv.cache.cached_pages == kv.pool.capacity
    return log, kv


@settings(max_examples=150, deadline=None)
@given(operations=ops, page_size=st.sampled_from([1, 2, 4]), policy=st.sampled_from(["lru", "lfu"]))
def test_radix_invariants_and_no_leaks(operations, page_size, policy):
    _, kv = run_ops(RadixCache, page_size, 24, operations, policy)
    kv.cache.evict(10**9)
    assert kv.pool.num_free == kv.pool.capacity


@settings(max_examples=150, deadline=None)
@given(operations=ops, page_size=st.sampled_from([1, 2, 3]))
def test_radix_matches_naive_without_eviction(operations, page_size):
    ops_no_evict = [o for o in operations if o[0] != "evict"]
    big = 2000  # never runs out, so neither cache evicts
    radix_log, _ = run_ops(RadixCache, page_size, big, ops_no_evict)
    naive_log, _ = run_ops(NaiveCache, page_size, big, ops_no_evict)
    assert radix_log == naive_log


@settings(max_examples=100, deadline=None)
@given(operations=ops)
def test_naive_reference_and_plain_cache_do_not_leak(operations):
    run_ops(NaiveCache, 2, 24, operations)
    _, kv = run_ops(PlainCache, 2, 24, operations)
    assert kv.pool.num_free == kv.pool.capacity


def test_shared_prefix_pages_are_shared_and_locked():
    pool = PagePool(64, 4)
    kv = KVManager(pool, RadixCache(pool))
    a = Holder(list(range(20)))
    kv.attach_prefix(a)
    assert kv.reserve(a, 20)
    a.num_computed = 20
    kv.release(a)
    assert kv.cache.cached_pages == 5
    b = Holder(list(range(17)) + [99, 98])
    assert kv.attach_prefix(b) == 16  # 4 whole shared pages
    assert b.pages == kv.cache.match_prefix(list(range(16))).pages
    assert kv.cache.evictable_pages == 1  # the 5th page; the 4 on b's path are locked
    assert kv.cache.evict(100) == 1
    assert kv.cache.cached_pages == 4
    kv.release(b, cache=False)
    assert kv.cache.evict(100) == 4
    assert pool.num_free == pool.capacity


@pytest.mark.parametrize("policy,expected_left", [("lru", [1]), ("lfu", [0])])
def test_eviction_policy_order(policy, expected_left):
    """Two cached branches; branch 0 was hit twice long ago, branch 1 once recently."""
    pool = PagePool(16, 1)
    cache = RadixCache(pool, policy)
    for first in (0, 1):
        pages = pool.alloc(2)
        cache.insert([first, 5], pages)
    cache.match_prefix([0, 5])
    cache.match_prefix([0, 5])
    cache.match_prefix([1, 5])  # most recent access: branch 1
    for _ in range(5):
        cache.match_prefix([1, 5], touch=False)  # scheduling peeks change neither order
        cache.match_prefix([0, 5], touch=False)
    cache.evict(1)
    left = [k for k in (0, 1) if cache.match_prefix([k, 5]).pages]
    assert left == expected_left


def test_pool_double_free_is_an_error():
    pool = PagePool(4, 1)
    pages = pool.alloc(2)
    pool.free(pages)
    with pytest.raises(RuntimeError, match="freed twice"):
        pool.free(pages[:1])
    assert pool.alloc(4) is None  # only 3 usable pages: page 0 is the scratch page
