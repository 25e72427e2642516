"""PagePool: the free list of KV-cache pages, and how many pages the device can hold.

Page 0 is a scratch page, never handed out: padded rows of a batch (graph-runner padding, block
table padding) may read or write it harmlessly. Usable pages are 1 .. num_pages-1.
"""

from __future__ import annotations

from collections.abc import Iterable


class OutOfPagesError(RuntimeError):
    """The KV pool cannot hold the request even after evicting every unlocked cached page."""


class PagePool:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 2:
            raise ValueError(f"num_pages: the KV pool needs at least 2 pages, got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size: must be >= 1, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: list[int] = list(range(num_pages - 1, 0, -1))  # pop() hands out low ids first
        self._is_free = [False] + [True] * (num_pages - 1)

    @property
    def capacity(self) -> int:
        """Pages that can ever be handed out (all but the scratch page)."""
        return self.num_pages - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        """``n`` distinct free pages, or None (and nothing taken) if fewer are free."""
        if n > len(self._free):
            return None
        out = [self._free.pop() for _ in range(n)]
        for p in out:
            self._is_free[p] = False
        return out

    def free(self, pages: Iterable[int]) -> None:
        for p in pages:
            if p <= 0 or p >= self.num_pages or self._is_free[p]:
                raise RuntimeError(f"page {p} freed twice or out of range (pool of {self.num_pages})")
            self._is_free[p] = True
            self._free.append(p)

    def reset(self) -> None:
        self.__init__(self.num_pages, self.page_size)


def pages_for_budget(budget_bytes: int, bytes_per_token: int, page_size: int) -> int:
    """Pages that fit in ``budget_bytes`` when one token's K/V (all layers) takes
    ``bytes_per_token``; +1 for the scratch page."""
    return max(0, budget_bytes // (bytes_per_token * page_size)) + 1


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, kv_itemsize: int) -> int:
    return 2 * num_layers * num_kv_heads * head_dim * kv_itemsize
