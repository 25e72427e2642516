"""NaiveCache: the reference the radix cache is tested against.

A dict from each cached page-aligned prefix (the full token tuple up to the end of a page) to
that page's id. Every operation is a brute-force scan; it is slow and obviously correct.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from infer.core.cache.base import PrefixCache, PrefixMatch
from infer.core.cache.page_pool import PagePool


class NaiveCache(PrefixCache):
    def __init__(self, pool: PagePool, eviction_policy: str = "lru") -> None:
        super().__init__(pool)
        self.policy = eviction_policy
        self.page_of: dict[tuple[int, ...], int] = {}
        self.locks: dict[tuple[int, ...], int] = {}
        self.last: dict[tuple[int, ...], int] = {}
        self.hits: dict[tuple[int, ...], int] = {}
        self._clock = itertools.count(1)

    def _prefixes(self, tokens: Sequence[int]) -> list[tuple[int, ...]]:
        ps = self.page_size
        return [tuple(tokens[:(i + 1) * ps]) for i in range(len(tokens) // ps)]

    def match_prefix(self, tokens: Sequence[int], touch: bool = True) -> PrefixMatch:
        pages, key = [], None
        now = next(self._clock)
        for k in self._prefixes(tokens):
            if k not in self.page_of:
                break
            pages.append(self.page_of[k])
            if touch:
                self.last[k] = now
                self.hits[k] = self.hits.get(k, 0) + 1
            key = k
        return PrefixMatch(pages, key)

    def insert(self, tokens: Sequence[int], pages: Sequence[int]) -> PrefixMatch:
        now = next(self._clock)
        out = []
        for k, p in zip(self._prefixes(tokens), pages, strict=True):
            if k not in self.page_of:
                self.page_of[k] = p
                self.last[k] = now
                self.hits[k] = 0
            out.append(self.page_of[k])
        return PrefixMatch(out, tuple(tokens) if out else None)

    def lock(self, handle: Any) -> None:
        for k in self._prefixes(handle or ()):
            self.locks[k] = self.locks.get(k, 0) + 1

    def unlock(self, handle: Any) -> None:
        for k in self._prefixes(handle or ()):
            self.locks[k] -= 1
            assert self.locks[k] >= 0

    def _evictable_leaves(self) -> list[tuple[int, ...]]:
        ps = self.page_size
        parents = {k[:-ps] for k in self.page_of}
        return [k for k in self.page_of if k not in parents and not self.locks.get(k, 0)]

    def evict(self, num_pages: int) -> int:
        freed = 0
        while freed < num_pages:
            leaves = self._evictable_leaves()
            if not leaves:
                break
            if self.policy == "lfu":
                k = min(leaves, key=lambda k: (self.hits[k], self.last[k]))
            else:
                k = min(leaves, key=lambda k: self.last[k])
            self.pool.free([self.page_of.pop(k)])
            freed += 1
        return freed

    @property
    def cached_pages(self) -> int:
        return len(self.page_of)

    @property
    def evictable_pages(self) -> int:
        return sum(1 for k in self.page_of if not self.locks.get(k, 0))

    def reset(self) -> None:
        self.pool.free(self.page_of.values())
        self.page_of.clear()
