"""PlainCache: no prefix sharing (--disable-radix-cache). Nothing is stored; every request's
pages are private and go back to the pool when it ends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infer.core.cache.base import PrefixCache, PrefixMatch


class PlainCache(PrefixCache):
    enabled = False

    def match_prefix(self, tokens: Sequence[int], touch: bool = True) -> PrefixMatch:
        return PrefixMatch([], None)

    def insert(self, tokens: Sequence[int], pages: Sequence[int]) -> PrefixMatch:
        return PrefixMatch([], None)  # nothing taken: every page stays the caller's

    def lock(self, handle: Any) -> None:
        assert handle is None

    def unlock(self, handle: Any) -> None:
        assert handle is None

    def evict(self, num_pages: int) -> int:
        return 0

    @property
    def cached_pages(self) -> int:
        return 0

    @property
    def evictable_pages(self) -> int:
        return 0

    def reset(self) -> None:
        pass
