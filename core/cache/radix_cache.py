"""RadixCache: a radix tree over token ids whose edges are whole pages (RadixAttention).

Each node's ``key`` is a token tuple of length ``len(pages) * page_size``; children are keyed by
their first page of tokens, so siblings never share a first page. ``lock_ref`` of a node counts
the locks held on it or on any descendant, so a node with lock_ref 0 has only unlocked
descendants. Eviction removes unlocked leaves in policy order (lru: oldest access first; lfu:
fewest hits first, then oldest).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from infer.core.cache.base import PrefixCache, PrefixMatch
from infer.core.cache.page_pool import PagePool

EVICTION_POLICIES = ("lru", "lfu")


class _Node:
    __slots__ = ("key", "pages", "parent", "children", "lock_ref", "last_access", "hits")

    def __init__(self, key: tuple[int, ...], pages: list[int], parent: _Node | None) -> None:
        self.key = key
        self.pages = pages
        self.parent = parent
        self.children: dict[tuple[int, ...], _Node] = {}
        self.lock_ref = 0
        self.last_access = 0
        self.hits = 0


class RadixCache(PrefixCache):
    def __init__(self, pool: PagePool, eviction_policy: str = "lru") -> None:
        super().__init__(pool)
        if eviction_policy not in EVICTION_POLICIES:
            raise ValueError(f"radix_eviction_policy: must be one of {EVICTION_POLICIES}, "
                             f"got {eviction_policy!r}")
        self.policy = eviction_policy
        self._clock = itertools.count(1)
        self.reset_tree()

    def reset_tree(self) -> None:
        self.root = _Node((), [], None)
        self.root.lock_ref = 1  # the root is never evicted
        self._cached = 0
        self._locked = 0  # pages on nodes with lock_ref > 0

    # -- queries -----------------------------------------------------------------------------
    def _first(self, tokens: Sequence[int], i: int) -> tuple[int, ...]:
        return tuple(tokens[i:i + self.page_size])

    def _walk(self, tokens: Sequence[int], touch: bool = True) -> tuple[_Node, list[int]]:
        """Deepest node matching a page-aligned prefix of tokens, splitting a partly matched
        edge so the result ends exactly at the match."""
        ps = self.page_size
        usable = len(tokens) // ps * ps
        node, pages, i = self.root, [], 0
        now = next(self._clock)
        while i < usable:
            child = node.children.get(self._first(tokens, i))
            if child is None:
                break
            n = 0  # pages of child's key matched
            while n < len(child.pages) and i + (n + 1) * ps <= usable and \
                    tuple(child.key[n * ps:(n + 1) * ps]) == tuple(tokens[i + n * ps:i + (n + 1) * ps]):
                n += 1
            if n < len(child.pages):
                child = self._split(child, n)
            if touch:
                child.last_access = now
                child.hits += 1
            pages.extend(child.pages)
            i += n * ps
            node = child
            if n == 0:
                break
        return node, pages

    def _split(self, child: _Node, n: int) -> _Node:
        """Cut ``child`` after its first ``n`` pages; returns the new upper node."""
        ps = self.page_size
        parent = child.parent
        assert parent is not None and 0 < n < len(child.pages)
        upper = _Node(child.key[:n * ps], child.pages[:n], parent)
        upper.lock_ref, upper.last_access, upper.hits = child.lock_ref, child.last_access, child.hits
        parent.children[upper.key[:ps]] = upper
        child.key, child.pages, child.parent = child.key[n * ps:], child.pages[n:], upper
        upper.children[child.key[:ps]] = child
        return upper

    def match_prefix(self, tokens: Sequence[int], touch: bool = True) -> PrefixMatch:
        node, pages = self._walk(tokens, touch)
        return PrefixMatch(pages, node if node is not self.root else None)

    # -- mutation ----------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], pages: Sequence[int]) -> PrefixMatch:
        ps = self.page_size
        assert len(tokens) == len(pages) * ps, "insert needs page-aligned tokens"
        node, have = self._walk(tokens)
        if len(have) < len(pages):
            key = tuple(tokens[len(have) * ps:])
            new = _Node(key, list(pages[len(have):]), node)
            new.last_access = next(self._clock)
            node.children[key[:ps]] = new
            self._cached += len(new.pages)
            node = new
            have = have + new.pages
        return PrefixMatch(have, node if node is not self.root else None)

    def lock(self, handle: _Node | None) -> None:
        node = handle
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                self._locked += len(node.pages)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, handle: _Node | None) -> None:
        node = handle
        while node is not None and node is not self.root:
            assert node.lock_ref > 0, "unlock without lock"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._locked -= len(node.pages)
            node = node.parent

    def _order(self, node: _Node) -> tuple:
        return (node.hits, node.last_access) if self.policy == "lfu" else (node.last_access,)

    def evict(self, num_pages: int) -> int:
        tie = itertools.count()
        heap = [(self._order(n), next(tie), n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_pages and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[node.key[:self.page_size]]
            self.pool.free(node.pages)
            freed += len(node.pages)
            self._cached -= len(node.pages)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (self._order(parent), next(tie), parent))
        return freed

    def _leaves(self) -> list[_Node]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            if not n.children and n is not self.root:
                out.append(n)
            stack.extend(n.children.values())
        return out

    @property
    def cached_pages(self) -> int:
        return self._cached

    @property
    def evictable_pages(self) -> int:
        return self._cached - self._locked

    def reset(self) -> None:
        if self._locked:
            raise RuntimeError("cannot reset the prefix cache while requests hold cached pages")
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            self.pool.free(n.pages)
            stack.extend(n.children.values())
        self.reset_tree()
