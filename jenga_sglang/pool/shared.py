"""One JengaPool behind two engine allocators (KV tokens and SSM states), in engine ids.

SGLang's KV and Mamba allocators each hand out slot ids from 1 (slot 0 is the write target of
padded tokens, the sink row of layout.py). Here engine id i >= 1 of a type is JengaPool page
i - 1 of that type, so the two allocators draw small pages from one pool: a large page is carved
for KV or for states on demand, and returns to the one free list when its last page is freed.
No page ever moves.

State reserve. An engine that admits requests by KV tokens and then expects each new request to
find its SSM state slot (SGLang's scheduler asserts it) must not see KV take the last large
pages. So `room(kv)` leaves enough free large pages for `state_reserve` states beyond the empty
state pages already carved; states may use the reserve, KV never does.

Pure integer bookkeeping (no torch); binding/jenga_allocator.py turns ids into tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.radix.memory import IdPages, OutOfMemory, PageType

_OWNER = 0  # SGLang's allocators do not say which request allocates: one owner for all


class SharedJengaPool:
    """`pool` shared by a KV type and a state type, in engine ids (page id + 1)."""

    def __init__(
        self, pool: JengaPool, kv_type: PageType, state_type: PageType, state_reserve: int
    ) -> None:
        if state_reserve < 0:
            raise ValueError(f"state reserve must be >= 0, got {state_reserve}")
        for ptype in (kv_type, state_type):
            if ptype not in pool.page_types:
                raise ValueError(f"{ptype} is not a page type of the pool {pool.page_types}")
        per_state = pool.geometry.of(state_type).per_large
        if -(-state_reserve // per_state) >= pool.num_large:
            raise ValueError(
                f"a reserve of {state_reserve} states fills all {pool.num_large} large pages "
                f"({per_state} states each): no room is left for KV"
            )
        self.pool = pool
        self.kv_type, self.state_type = kv_type, state_type
        self.state_reserve = state_reserve
        self._allocated = {kv_type: 0, state_type: 0}

    def max_ids(self, ptype: PageType) -> int:
        """Engine ids of `ptype` are 1..max_ids (every large page carved as it)."""
        return self.pool.num_pages(ptype)

    def allocated(self, ptype: PageType) -> int:
        return self._allocated[ptype]

    def room(self, ptype: PageType) -> int:
        """Pages of `ptype` `alloc` can take now (KV: without touching the state reserve)."""
        pool = self.pool
        per = pool.geometry.of(ptype).per_large
        free_large = pool.free_large_pages
        if ptype == self.kv_type:
            short = max(0, self.state_reserve - pool.empty_pages(self.state_type))
            per_state = pool.geometry.of(self.state_type).per_large
            free_large = max(0, free_large - -(-short // per_state))
        return pool.empty_pages(ptype) + free_large * per

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
        """Free every page of `ptype` (an engine reset); the other type keeps its pages."""
        self.free(ptype, self.allocated_ids(ptype))

    def check_integrity(self) -> None:
        """The pool's invariants, and our per-type counts equal to its used pages."""
        self.pool.check_integrity()
        for ptype, n in self._allocated.items():
            used = self.pool.usage(ptype).used
            assert used == n, f"{ptype}: {n} pages counted as allocated, the pool has {used} used"
