"""The prefix-cache interface. Pure Python: page ids and token ids, never tensors.

Units: a *page* holds ``page_size`` consecutive tokens' K/V (one row of every layer's
``[num_pages, page_size, Hkv, D]`` cache). Only whole pages are ever cached or shared, so every
token sequence handed to a cache is page-aligned: ``len(tokens) == len(pages) * page_size``.

Ownership invariant (checked by the tests after every operation):
    pool.num_free + cache.cached_pages + pages held privately by live requests == pool.capacity
where ``cached_pages`` counts every page stored in the cache (locked or not). A page is either
free, in the cache, or private to exactly one request; never two of these.

Locking: a request that reuses cached pages locks the handle returned by ``match_prefix`` /
``insert``; locked pages (the handle's node and all its ancestors) are never evicted. Every
``lock`` is paired with exactly one ``unlock`` of the same handle.

Thread-safety: none; the scheduler thread is the only caller.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from infer.core.cache.page_pool import PagePool


@dataclass
class PrefixMatch:
    pages: list[int]  # cached pages covering tokens[: len(pages) * page_size]
    handle: Any  # opaque; pass to lock/unlock. None when nothing matched.

    def num_tokens(self, page_size: int) -> int:
        return len(self.pages) * page_size


class PrefixCache(ABC):
    """A store of page-aligned token prefixes and the pages that hold their K/V."""

    enabled: bool = True  # False: nothing is ever cached (--disable-radix-cache)

    def __init__(self, pool: PagePool) -> None:
        self.pool = pool
        self.page_size = pool.page_size

    @abstractmethod
    def match_prefix(self, tokens: Sequence[int], touch: bool = True) -> PrefixMatch:
        """Longest cached page-aligned prefix of ``tokens`` (any length; a partial last page is
        ignored). Mutates only access statistics (recency, hit counts; not with ``touch=False``,
        a peek for scheduling) and may split an internal node; it never frees, locks or
        allocates pages."""

    @abstractmethod
    def insert(self, tokens: Sequence[int], pages: Sequence[int]) -> PrefixMatch:
        """Store ``pages`` as the K/V of page-aligned ``tokens``. Where the cache already holds a
        page for a prefix it keeps its own; the returned match lists the cache's pages for the
        whole of ``tokens``. Ownership: every page of ``pages`` not in the result stays the
        caller's (a duplicate it must free); every page in the result is now the cache's.
        Does not lock."""

    @abstractmethod
    def lock(self, handle: Any) -> None:
        """Protect the pages on the path to ``handle`` from eviction (reference-counted)."""

    @abstractmethod
    def unlock(self, handle: Any) -> None:
        """Undo one ``lock(handle)``."""

    @abstractmethod
    def evict(self, num_pages: int) -> int:
        """Free at least ``num_pages`` unlocked pages to the pool if possible (whole leaves, in
        the eviction policy's order); returns the number freed."""

    @property
    @abstractmethod
    def cached_pages(self) -> int:
        """Pages stored in the cache, locked or not."""

    @property
    @abstractmethod
    def evictable_pages(self) -> int:
        """Cached pages no request has locked."""

    @abstractmethod
    def reset(self) -> None:
        """Drop every entry, returning its pages to the pool. Only valid with nothing locked."""
