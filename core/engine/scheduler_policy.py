"""Orderings of the waiting queue (--schedule-policy) and priority comparison. No torch.

Every policy returns a permutation of the waiting list; it never drops or adds requests.
    fcfs        arrival order (retracted requests keep their place at the front)
    lpm         longest cached-prefix match first (ties: arrival order)
    dfs-weight  depth-first over the trie of waiting and running prompts, heaviest subtree first
                (weight = requests in it, running ones included), so requests sharing a prefix
                with what runs now or with each other go back to back, largest groups first
    lof         longest output (max_new_tokens) first
    random      a seeded shuffle
With more than PREFIX_POLICY_MAX_QUEUE waiting requests, lpm and dfs-weight fall back to fcfs
(as SGLang does), so ordering stays cheap under a flood.
    priority    priority only (same as fcfs with --enable-priority-scheduling)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from infer.core.engine.request import Request

POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random", "priority")
PREFIX_POLICY_MAX_QUEUE = 128  # longer queues use fcfs for lpm / dfs-weight (their cost grows)


def priority_key(req: Request, low_values_first: bool) -> int:
    """Smaller key = scheduled earlier."""
    return req.priority if low_values_first else -req.priority


def order_waiting(waiting: Sequence[Request], policy: str, prefix_len: Callable[[Request], int],
                  rng: random.Random, priority: bool = False, low_values_first: bool = False,
                  running: Sequence[Request] = ()) -> list[Request]:
    if policy not in POLICIES:
        raise ValueError(f"schedule_policy: must be one of {', '.join(POLICIES)}, got {policy!r}")
    reqs = list(waiting)
    if policy in ("lpm", "dfs-weight") and len(reqs) > PREFIX_POLICY_MAX_QUEUE:
        policy = "fcfs"
    if policy == "lpm":
        lens = {id(r): prefix_len(r) for r in reqs}
        reqs.sort(key=lambda r: -lens[id(r)])
    elif policy == "dfs-weight":
        waiting_ids = {id(r) for r in reqs}
        reqs = [r for r in _dfs_weight(reqs + list(running), 0) if id(r) in waiting_ids]
    elif policy == "lof":
        reqs.sort(key=lambda r: -(r.params.max_new_tokens or 1 << 30))
    elif policy == "random":
        rng.shuffle(reqs)
    if priority or policy == "priority":
        reqs.sort(key=lambda r: priority_key(r, low_values_first))  # stable: policy order within
    return reqs


def _dfs_weight(reqs: list[Request], depth: int) -> list[Request]:
    """Requests grouped by the token at ``depth`` of their prompt; groups with more requests
    first (ties: earliest member first); within a group, recurse one token deeper."""
    if len(reqs) <= 1:
        return reqs
    while True:  # skip the common prefix in one go
        heads = {tuple(r.prompt_ids[depth:depth + 1]) for r in reqs}
        if len(heads) != 1 or heads == {()}:
            break
        depth += 1
    done = [r for r in reqs if len(r.prompt_ids) <= depth]
    groups: dict[int, list[Request]] = {}
    for r in reqs:
        if len(r.prompt_ids) > depth:
            groups.setdefault(r.prompt_ids[depth], []).append(r)
    ordered = sorted(groups.values(), key=lambda g: (-len(g), reqs.index(g[0])))
    out = list(done)
    for g in ordered:
        out.extend(_dfs_weight(g, depth + 1))
    return out
