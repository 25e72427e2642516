"""KVManager: request-level page accounting on top of a PagePool and a PrefixCache.

A *holder* is any object with the Request fields ``pages``, ``num_prefix_pages``,
``cache_handle``, ``num_computed`` and ``all_ids`` (see infer.core.engine.request). The manager
mutates only those fields, the pool and the cache. Invariant after every call:
``holder.pages[:num_prefix_pages]`` are cache pages locked through ``cache_handle``; the rest of
``holder.pages`` are private to the holder. The manager remembers, per holder, the first index of
``holder.pages`` changed since ``take_changed(holder)`` was last called, so a consumer holding a
copy of the page list (the model runner's block-table rows) refreshes only what changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infer.core.cache.base import PrefixCache
from infer.core.cache.page_pool import PagePool


class KVManager:
    def __init__(self, pool: PagePool, cache: PrefixCache) -> None:
        self.pool = pool
        self.cache = cache
        self.page_size = pool.page_size
        self._synced: dict[int, int] = {}  # id(holder) -> leading pages unchanged since take_changed

    def _changed(self, holder: Any, index: int) -> None:
        key = id(holder)
        if key in self._synced:
            self._synced[key] = min(self._synced[key], index)

    def take_changed(self, holder: Any) -> int:
        """First index of ``holder.pages`` changed since the last call (0 the first time); from
        now on the consumer is taken to hold the current list."""
        lo = self._synced.get(id(holder), 0)
        self._synced[id(holder)] = len(holder.pages)
        return min(lo, len(holder.pages))

    # -- capacity --------------------------------------------------------------------------
    @property
    def available_pages(self) -> int:
        """Pages an allocation could get now: free plus evictable cached pages."""
        return self.pool.num_free + self.cache.evictable_pages

    def pages_needed(self, holder: Any, upto_tokens: int) -> int:
        return max(0, -(-upto_tokens // self.page_size) - len(holder.pages))

    # -- admission -------------------------------------------------------------------------
    def peek_prefix(self, tokens: Sequence[int]) -> int:
        """Cached tokens a request with ``tokens`` would reuse (for scheduling policies)."""
        if not self.cache.enabled:
            return 0
        m = self.cache.match_prefix(tokens[:max(0, len(tokens) - 1)], touch=False)
        return len(m.pages) * self.page_size

    def attach_prefix(self, holder: Any, limit: int | None = None) -> int:
        """Give a holder with no pages its longest cached prefix (always leaving at least one
        token to compute, whose logits are sampled; at most ``limit`` tokens when given).
        Returns the number of cached tokens."""
        assert not holder.pages and holder.cache_handle is None
        ids = holder.all_ids
        n = len(ids) - 1 if limit is None else min(len(ids) - 1, limit)
        m = self.cache.match_prefix(ids[:n])
        self.cache.lock(m.handle)
        holder.pages = list(m.pages)
        self._synced.pop(id(holder), None)
        holder.num_prefix_pages = len(m.pages)
        holder.cache_handle = m.handle
        holder.num_computed = len(m.pages) * self.page_size
        return holder.num_computed

    def reserve(self, holder: Any, upto_tokens: int) -> bool:
        """Make ``holder.pages`` cover ``upto_tokens`` tokens, evicting unlocked cached pages if
        needed. All or nothing: returns False (and changes nothing) if the pool is too small."""
        need = self.pages_needed(holder, upto_tokens)
        if need == 0:
            return True
        if self.pool.num_free < need:
            self.cache.evict(need - self.pool.num_free)
        got = self.pool.alloc(need)
        if got is None:
            return False
        self._changed(holder, len(holder.pages))
        holder.pages.extend(got)
        return True

    # -- caching ---------------------------------------------------------------------------
    def _insert(self, holder: Any) -> None:
        """Move the holder's computed whole pages into the cache and re-lock its new path."""
        ps = self.page_size
        n_pages = holder.num_computed // ps
        if not self.cache.enabled or n_pages <= holder.num_prefix_pages:
            return
        ids = holder.all_ids
        m = self.cache.insert(ids[:n_pages * ps], holder.pages[:n_pages])
        k = holder.num_prefix_pages  # pages[:k] are already the cache's own (locked)
        dups = [p for p, q in zip(holder.pages[k:n_pages], m.pages[k:], strict=True) if p != q]
        self.pool.free(dups)
        self.cache.lock(m.handle)
        self.cache.unlock(holder.cache_handle)
        holder.pages[:n_pages] = m.pages
        self._changed(holder, k)
        holder.num_prefix_pages = n_pages
        holder.cache_handle = m.handle

    def cache_unfinished(self, holder: Any) -> None:
        """After a prefill chunk: share the computed whole pages with later requests."""
        self._insert(holder)

    def release(self, holder: Any, cache: bool = True) -> None:
        """The holder ends (finished, aborted or retracted): cache its computed whole pages if
        ``cache``, free its private pages, unlock its prefix. Leaves ``holder.pages`` empty."""
        if cache:
            self._insert(holder)
        self.pool.free(holder.pages[holder.num_prefix_pages:])
        self.cache.unlock(holder.cache_handle)
        holder.pages = []
        self._synced.pop(id(holder), None)
        holder.num_prefix_pages = 0
        holder.cache_handle = None

    def truncate(self, holder: Any, num_tokens: int) -> None:
        """Roll back a running holder's tail to its first ``num_tokens`` tokens (rejected draft
        tokens of speculative decoding): ``num_computed`` drops to at most ``num_tokens`` and the
        private pages past the last one still needed go back to the pool. The cached prefix is
        never rolled back: ``num_tokens`` below it is a ValueError."""
        ps = self.page_size
        if num_tokens < holder.num_prefix_pages * ps:
            raise ValueError(f"truncate: {num_tokens} tokens would cut into the "
                             f"{holder.num_prefix_pages * ps}-token cached prefix")
        keep = max(-(-num_tokens // ps), holder.num_prefix_pages)
        if keep < len(holder.pages):
            self.pool.free(holder.pages[keep:])
            del holder.pages[keep:]
            self._changed(holder, keep)
        holder.num_computed = min(holder.num_computed, num_tokens)

    def flush(self) -> None:
        self.cache.reset()
