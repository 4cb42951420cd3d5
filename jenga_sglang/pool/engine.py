"""A JengaPool in engine ids: what SGLang's slot allocators hand out.

SGLang's KV and Mamba allocators number slots from 1 (slot 0 is the write target of padded
tokens, the sink row of layout.py). Here engine id i >= 1 of a type is JengaPool page i - 1 of
that type, so several allocators draw small pages from one pool: a large page is carved for a
type on demand, and returns to the one free list when its last page is freed. No page ever
moves. Subclasses say how much each allocator may report as available (shared.py: KV beside
states with a state reserve; paired.py: full and window KV of a sliding-window model).

Pure integer bookkeeping (no torch); binding/pools/allocator.py turns ids into tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.radix.pages import IdPages, OutOfMemory, PageType

_OWNER = 0  # SGLang's allocators do not say which request allocates: one owner for all


class EnginePool:
    """`pool` behind allocators of `types`, in engine ids (page id + 1)."""

    def __init__(self, pool: JengaPool, types: Sequence[PageType]) -> None:
        for ptype in types:
            if ptype not in pool.page_types:
                raise ValueError(f"{ptype} is not a page type of the pool {pool.page_types}")
        self.pool = pool
        self._allocated = dict.fromkeys(types, 0)

    def max_ids(self, ptype: PageType) -> int:
        """Engine ids of `ptype` are 1..max_ids (every large page carved as it)."""
        return self.pool.num_pages(ptype)

    def allocated(self, ptype: PageType) -> int:
        return self._allocated[ptype]

    def room(self, ptype: PageType) -> int:
        """Pages of `ptype` `alloc` can take now."""
        pool = self.pool
        return pool.empty_pages(ptype) + pool.free_large_pages * pool.geometry.of(ptype).per_large

    def available(self, ptype: PageType) -> int:
        """What the allocator of `ptype` reports as available to SGLang's scheduler (its
        admission reads it): `room` unless a subclass must be more careful."""
        return self.room(ptype)

    def alloc(self, ptype: PageType, count: int) -> list[int] | None:
        """`count` engine ids of `ptype`, or None (nothing taken) when there is no room."""
        if count > self.room(ptype):
            return None
        try:
            pages = self.pool.alloc(ptype, count, _OWNER)
        except OutOfMemory:  # cannot happen within room(); kept so a bug reads as no room
            return None
        self._allocated[ptype] += count
        return [page + 1 for page in pages.ids()]

    def free(self, ptype: PageType, ids: Sequence[int]) -> None:
        """Give engine ids back; raises ValueError (nothing freed) on an id not allocated."""
        if not ids:
            return
        bad = [i for i in ids if i < 1]
        if bad:
            raise ValueError(f"{ptype}: engine ids {bad[:5]} are the sink or negative")
        self.pool.free(ptype, IdPages([i - 1 for i in ids]))
        self._allocated[ptype] -= len(ids)

    def allocated_ids(self, ptype: PageType) -> list[int]:
        return [page + 1 for page in self.pool.used_pages(ptype)]

    def free_all(self, ptype: PageType) -> None:
        """Free every page of `ptype` (an engine reset); the other types keep their pages."""
        self.free(ptype, self.allocated_ids(ptype))

    def check_integrity(self) -> None:
        """The pool's invariants, and our per-type counts equal to its used pages."""
        self.pool.check_integrity()
        for ptype, n in self._allocated.items():
            used = self.pool.usage(ptype).used
            assert used == n, f"{ptype}: {n} pages counted as allocated, the pool has {used} used"
