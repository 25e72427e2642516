"""Data parallelism (``--dp-size N``): N engine replicas behind the one HTTP server.

``ReplicaSet`` offers the HTTP side the same interface as one ``EngineClient`` (``stream``,
``abort``, ``call``, ``stats``, ``dead``, ``ready``, ...) over one client per replica. A new
request goes to the replica that ``--load-balance-method`` picks:

- ``round_robin`` (also ``auto``): replicas in turn.
- ``total_requests`` (SGLang's older ``shortest_queue``): the fewest requests in flight from here.
- ``total_tokens``: the fewest tokens in flight (prompt tokens plus the tokens still allowed).

A request stays with its replica for its whole life (aborts go there). The first replica that
dies kills the set: every open stream ends with 503 and the server exits non-zero, as with one
engine. Control calls go to every replica (``stats`` answers a sum plus ``replicas``: the list).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

from infer.server import ipc

_SUMMED = ("running", "queued", "pages_total", "pages_free", "pages_cached", "prompt_tokens",
           "generated_tokens", "cached_tokens", "num_retractions", "num_preemptions")
METHODS = ("auto", "round_robin", "total_requests", "total_tokens")


def merge_stats(per: list[dict[str, Any]]) -> dict[str, Any]:
    """The replicas' stats as one engine's, with the list of each under ``replicas``."""
    out: dict[str, Any] = dict(per[0]) if per else {}
    for key in _SUMMED:
        if all(isinstance(s.get(key), (int, float)) for s in per):
            out[key] = sum(s[key] for s in per)
    if per and all("prompt_tokens" in s for s in per):
        prompt = sum(s["prompt_tokens"] for s in per)
        out["prefix_cache_hit_rate"] = sum(s["cached_tokens"] for s in per) / prompt if prompt else 0.0
    if all(isinstance(out.get(k), (int, float)) for k in ("pages_total", "pages_free", "pages_cached")):
        total = out["pages_total"]
        out["token_usage"] = (total - out["pages_free"] - out["pages_cached"]) / total if total else 0.0
    out["replicas"] = [dict(s, dp_rank=i) for i, s in enumerate(per)]
    return out


class ReplicaSet:
    def __init__(self, clients: list[Any], method: str = "round_robin") -> None:
        if method not in METHODS:
            raise ValueError(f"--load-balance-method {method}: infer balances replicas with "
                             f"{', '.join(METHODS)}")
        self.clients = clients
        self.method = "round_robin" if method == "auto" else method
        self.ready = clients[0].ready
        self._turn = itertools.cycle(range(len(clients)))
        self._owner: dict[str, int] = {}  # rid -> replica
        self._tokens = [0] * len(clients)  # in-flight token estimate per replica
        self._on_death: Callable[[str], None] | None = None

    # -- the EngineClient surface ------------------------------------------------------------
    @property
    def dead(self) -> str | None:
        for i, c in enumerate(self.clients):
            if c.dead:
                return f"replica {i}: {c.dead}"
        return None

    @property
    def stats(self) -> dict[str, Any]:
        return merge_stats([c.stats for c in self.clients])

    @property
    def num_open(self) -> int:
        return sum(c.num_open for c in self.clients)

    @property
    def on_death(self) -> Callable[[str], None] | None:
        return self._on_death

    @on_death.setter
    def on_death(self, fn: Callable[[str], None] | None) -> None:
        self._on_death = fn
        for i, c in enumerate(self.clients):
            c.on_death = None if fn is None else self._death_of(i)

    def _death_of(self, i: int) -> Callable[[str], None]:
        def died(why: str) -> None:
            for other in self.clients:  # the set is gone: end the other replicas' streams too
                if other is not self.clients[i] and not other.dead:
                    other._die(f"replica {i} died ({why})")
            if self._on_death is not None:
                self._on_death(f"replica {i}: {why}")
        return died

    @property
    def on_signal(self) -> Callable[[int], None] | None:
        return self.clients[0].on_signal

    @on_signal.setter
    def on_signal(self, fn: Callable[[int], None] | None) -> None:
        for c in self.clients:
            c.on_signal = fn

    def start(self) -> None:
        for c in self.clients:
            c.start()

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.clients))

    def pick(self, req: ipc.AddRequest) -> int:
        if self.method == "round_robin":
            return next(self._turn)
        if self.method == "total_requests":
            loads = [c.num_open for c in self.clients]
        else:
            loads = self._tokens
        return min(range(len(self.clients)), key=lambda i: (loads[i], i))

    @staticmethod
    def _cost(req: ipc.AddRequest) -> int:
        p = req.params  # SamplingParams
        return (getattr(p, "n", 1) or 1) * (len(req.prompt_ids) + (getattr(p, "max_new_tokens", 0) or 0))

    async def stream(self, req: ipc.AddRequest) -> AsyncIterator[ipc.SeqOutput]:
        i = self.pick(req)
        cost = self._cost(req)
        self._owner[req.rid] = i
        self._tokens[i] += cost
        try:
            async for out in self.clients[i].stream(req):
                yield out
        finally:
            self._tokens[i] -= cost
            self._owner.pop(req.rid, None)

    def rids_of(self, rid: str) -> list[str]:
        return [r for c in self.clients for r in c.rids_of(rid)]

    async def abort(self, rid: str | None) -> None:
        owner = self._owner.get(rid) if rid is not None else None
        targets = self.clients if owner is None else [self.clients[owner]]
        await asyncio.gather(*(c.abort(rid) for c in targets))

    async def call(self, op: str, timeout: float = 30.0) -> Any:
        results = await asyncio.gather(*(c.call(op, timeout=timeout) for c in self.clients))
        if op == "stats":
            return merge_stats(list(results))
        if op == "flush_cache":
            return all(results)
        return results[0]
