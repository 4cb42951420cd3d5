"""One JengaPool behind two engine allocators (KV tokens and SSM states), in engine ids
(engine.py): a large page is carved for KV or for states on demand, and returns to the one
free list when its last page is freed. No page ever moves.

State reserve. An engine that admits requests by KV tokens and then expects each new request to
find its SSM state slots (SGLang's scheduler asserts it) must not see KV take the last large
pages. `state_reserve` is the most states requests can hold at once (SGLang: max running
requests x (1 + tracking slots)). `room(kv)` leaves free large pages for what of it is still
*needed*, `reserve_needed() = max(0, state_reserve - held_by_requests)`, beyond the empty state
pages already carved; states may use the reserve, KV never does. `held_by_requests` is
`allocated(state) - tree_states()`, every allocated state the attached tree does not hold (a
request's slot, its tracking slots, a fork on its way into the tree, a slot pre-allocated for
a batch); with no tree attached nothing is netted (the whole reserve stays closed to KV).

Why it still suffices. Let room = `room(state)`, H = states held by requests, T = the tree's
states. KV carves a large page only while room >= state_reserve - H afterwards, so
room + H >= state_reserve right after any KV carve. Afterwards a state alloc or a request's free
moves one state between room and H, a KV free only adds room, an eviction moves T to room, and
an adoption by the tree moves H to T: room + H + T >= state_reserve holds at every moment. When
k new requests are admitted (the scheduler keeps running requests <= max running), the others
hold at most (max - k) x (1 + tracking) states, so the new requests need at most
state_reserve - H more: no more than room + T, i.e. free room or tree states that the engine's
eviction (SGLang's `ensure_mamba_capacity`) reclaims before it allocates. Netting H loses no
state the new requests could take (a held state is not free to them), which is why the reserve
may shrink while requests hold states. What KV restraint cannot promise, with or without the
netting, is a tree state locked at that moment by a running request's prefix; the engine then
reclaims bytes by evicting unlocked KV leaves (the old, un-netted reserve had extra slack there:
the states allocated at the last KV carve).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from jenga_sglang.pool.engine import EnginePool
from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.radix.pages import PageType

TreeStates = Callable[[], int]  # how many allocated states the engine's prefix tree holds now


class SharedJengaPool(EnginePool):
    """`pool` shared by a KV type and a state type, in engine ids (page id + 1)."""

    def __init__(
        self, pool: JengaPool, kv_type: PageType, state_type: PageType, state_reserve: int
    ) -> None:
        if state_reserve < 0:
            raise ValueError(f"state reserve must be >= 0, got {state_reserve}")
        super().__init__(pool, (kv_type, state_type))
        per_state = pool.geometry.of(state_type).per_large
        if -(-state_reserve // per_state) >= pool.num_large:
            raise ValueError(
                f"a reserve of {state_reserve} states fills all {pool.num_large} large pages "
                f"({per_state} states each): no room is left for KV"
            )
        self.kv_type, self.state_type = kv_type, state_type
        self.state_reserve = state_reserve
        self._tree_states: TreeStates | None = None

    def attach_tree(self, tree_states: TreeStates) -> None:
        """Net the reserve against request-held states from now on: every allocated state
        `tree_states()` does not count is a request's (module doc)."""
        self._tree_states = tree_states

    def held_by_requests(self) -> int:
        """Allocated states that no tree holds; 0 (nothing netted) while no tree is attached."""
        if self._tree_states is None:
            return 0
        return max(0, self.allocated(self.state_type) - self._tree_states())

    def reserve_needed(self) -> int:
        """States the reserve must still keep reachable: what requests may yet demand."""
        return max(0, self.state_reserve - self.held_by_requests())

    def room(self, ptype: PageType) -> int:
        """Pages of `ptype` `alloc` can take now (KV: without touching the state reserve)."""
        if ptype != self.kv_type:
            return super().room(ptype)
        pool = self.pool
        return self._kv_room(pool.free_large_pages, pool.empty_pages(self.state_type))

    def kv_room_freeing(self, state_ids: Collection[int]) -> int:
        """`room(kv)` if the states of `state_ids` (distinct allocated engine ids) were freed,
        nothing moved: the KV a prefix tree could make room for by dropping those states.
        Freeing them leaves `reserve_needed()` as it is (the tree's states and the allocated
        ones fall alike), so what changes is which large pages are free and which state pages
        stay empty in carved ones (`JengaPool.release_outcome`)."""
        free_large, empty_states = self._freeing(state_ids)
        return self._kv_room(free_large, empty_states)

    def kv_closing(self, state_ids: Collection[int] = ()) -> int:
        """KV pages that freeing KV may fail to add to `room(kv)`, once the states of
        `state_ids` (distinct allocated engine ids) are freed as well: the reserve needs more
        large pages than are free, and takes each one a free returns until it has them.
        Freeing those states and any F KV pages changes `room(kv)` by at least F minus this,
        in any order: only the large pages the reserve closes are lost, with the empty KV
        pages they held, so room may even fall (the last used page of a KV large page freed
        hands the whole page to the reserve); freeing states never closes more. An admission
        that counts evictable KV as room must count this much less; it still fits what is
        free without evicting anything."""
        free_large, empty_states = self._freeing(state_ids)
        need = self._reserve_large(empty_states)
        return max(0, need - free_large) * self.pool.geometry.of(self.kv_type).per_large

    def kv_cost_of_state(self) -> int:
        """KV pages `room(kv)` loses when one more state is allocated and the tree holds it
        (a state loaded back from host memory): none while the reserve keeps enough empty
        state pages, else up to a large page's worth (the state's page is one the reserve
        counted on, so it closes a free large page, or the state carves one itself). With
        neither an empty state page nor a free large page the allocation must evict first,
        perhaps KV: a whole large page of KV, the most one state can take, is counted."""
        pool = self.pool
        free_large, empty = pool.free_large_pages, pool.empty_pages(self.state_type)
        if empty:
            after = self._kv_room(free_large, empty - 1)
        elif free_large:
            per_state = pool.geometry.of(self.state_type).per_large
            after = self._kv_room(free_large - 1, per_state - 1)
        else:
            return pool.geometry.of(self.kv_type).per_large
        return self.room(self.kv_type) - after

    def _freeing(self, state_ids: Collection[int]) -> tuple[int, int]:
        """Free large pages and empty state pages once the states of `state_ids` are freed,
        nothing moved (`JengaPool.release_outcome`)."""
        pool = self.pool
        whole = empty = 0
        if state_ids:
            whole, empty = pool.release_outcome(self.state_type, [i - 1 for i in state_ids])
        return pool.free_large_pages + whole, pool.empty_pages(self.state_type) + empty

    def _reserve_large(self, empty_states: int) -> int:
        """Large pages the reserve needs beyond `empty_states` empty state pages carved."""
        short = max(0, self.reserve_needed() - empty_states)
        return -(-short // self.pool.geometry.of(self.state_type).per_large)

    def _kv_room(self, free_large: int, empty_states: int) -> int:
        """KV pages that can be taken with `free_large` free large pages and `empty_states`
        empty state pages carved: the empty KV pages, plus the free large pages the reserve
        does not close (it closes what the empty state pages leave short of its need)."""
        closed = min(free_large, self._reserve_large(empty_states))
        kv_per_large = self.pool.geometry.of(self.kv_type).per_large
        return self.pool.empty_pages(self.kv_type) + (free_large - closed) * kv_per_large
