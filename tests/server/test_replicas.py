"""ReplicaSet's balancing and stats merging, with stand-in clients (no engine)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from infer.server.replicas import ReplicaSet, merge_stats


def _clients(n, open_streams=None):
    return [SimpleNamespace(ready="r", num_open=(open_streams or [0] * n)[i], dead=None, stats={})
            for i in range(n)]


def _req(prompt, max_new, n=1):
    return SimpleNamespace(prompt_ids=[1] * prompt, params=SimpleNamespace(n=n, max_new_tokens=max_new))


def test_round_robin_and_auto_take_turns():
    for method in ("round_robin", "auto"):
        rs = ReplicaSet(_clients(3), method)
        assert [rs.pick(_req(1, 1)) for _ in range(5)] == [0, 1, 2, 0, 1]


def test_total_requests_picks_the_fewest_open_streams():
    rs = ReplicaSet(_clients(3, [4, 1, 2]), "total_requests")
    assert rs.pick(_req(1, 1)) == 1


def test_total_tokens_counts_what_is_in_flight():
    rs = ReplicaSet(_clients(2), "total_tokens")
    rs._tokens = [100, 30]
    assert rs.pick(_req(1, 1)) == 1
    assert rs._cost(_req(10, 20, n=2)) == 60


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="follow_bootstrap_room"):
        ReplicaSet(_clients(2), "follow_bootstrap_room")


def test_stats_sum_and_keep_each_replica():
    a = dict(running=1, queued=2, pages_total=10, pages_free=6, pages_cached=2, prompt_tokens=10,
             generated_tokens=5, cached_tokens=5, num_retractions=0, num_preemptions=0)
    b = dict(a, running=3, prompt_tokens=30, cached_tokens=0, pages_free=10, pages_cached=0)
    m = merge_stats([a, b])
    assert m["running"] == 4 and m["prompt_tokens"] == 40 and m["pages_total"] == 20
    assert m["prefix_cache_hit_rate"] == pytest.approx(5 / 40)
    assert m["token_usage"] == pytest.approx((20 - 16 - 2) / 20)
    assert [r["dp_rank"] for r in m["replicas"]] == [0, 1] and m["replicas"][1]["running"] == 3
