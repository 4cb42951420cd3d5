"""SGLang's `--enable-unified-memory` as a cache memory the engine and the tree can drive.

Every page comes from SGLang 0.5.23's real allocators over one unified buffer of the budget
(bench/drivers/sglang_pools.py `unified_pools`, device="cpu", page size 1, the `no_buffer` Mamba
strategy the engine's one live state per request models): KV token slots from the
full-attention end (`UnifiedMambaTokenToKVPoolAllocator`, growing down from the top), Mamba
state slots from the other end (`UnifiedMambaSlotAllocator`, growing up above the one-state
slot-0 sink). Page ids are SGLang's virtual ids. So SGLang decides:

* *when an allocation fails*: the tree's policy evicts victims until SGLang's own view says the
  allocation can be served (`schedulable_available_size`: the free band between the two
  frontiers plus holes a compaction would release), then SGLang allocates; a state first runs
  `prepare_mamba_allocation`, as SGLang's `evict_for_alloc` does;
* *what moves*: frees go to SGLang's `free`. With lazy compaction (the server default) a free
  leaves a hole that its own side reuses, and an allocation short of room first compacts the
  other side (`_relieve_for_alloc`); with `SGLANG_DISABLE_LAZY_COMPACTION=1` every free compacts
  at once. The copies are skipped and counted (`moves()`): the Jenga pool never moves a byte;
* *admission* (`fits`), by the rule of SGLang's `PrefillAdder` on this allocator: KV tokens plus
  `mamba_slot_full_token_cost()` tokens per new state within `available_size()` plus the
  tree's evictable KV tokens (evictable states' bytes are not counted), and new states within
  the Mamba side's schedulable slots plus evictable states.

Not modelled: the scheduler's non-urgent `flush_opportunistic()` when it is idle (the engine
has no idle hook; in the long batch it is never idle), free groups (SGLang batches a step's
frees; with lazy compaction a free only makes a hole, so the batching changes nothing).

Importing this module imports sglang (15-27 s): the runner imports it only for this memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from jenga_sglang.bench.drivers import sglang_pools
from jenga_sglang.bench.drivers.sglang_buffer import moves_of
from jenga_sglang.bench.drivers.sglang_split import static_split
from jenga_sglang.binding.slots.ids import Ids, SlotPages, as_ids
from jenga_sglang.binding.slots.memory import SlotIdMemory, SlotMemory
from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.radix.pages import IdPages, OutOfMemory, PageKind, Pages, PageType, Usage


class SglangUnifiedMemory(SlotIdMemory):
    """KV pages and SSM states in SGLang's unified pool (one attention and one Mamba group)."""

    def __init__(self, spec: ModelSpec, pools: sglang_pools.Pools) -> None:
        (attention,) = spec.attention_groups
        (mamba,) = spec.mamba_groups
        self.kv_type = PageType(PageKind.KV, spec.groups.index(attention))
        self.state_type = PageType(PageKind.STATE, spec.groups.index(mamba))
        self._composite = pools.allocator  # UnifiedMambaTokenToKVPoolAllocator
        self._full = self._composite.full_attn_allocator
        self._mamba = self._composite.mamba_allocator
        self._slots = pools.req_to_token_pool.mamba_allocator  # SGLang's state slot surface
        self._buffer = self._composite.unified_buffer
        self._ends = {self.kv_type: self._full, self.state_type: self._mamba}
        super().__init__(self._ends)
        self.lazy_compaction = bool(self._full.lazy_compaction)

    # ------------------------------------------------------------------ sizes

    def page_bytes(self, ptype: PageType) -> int:
        return int(self._ends[ptype].entry_bytes)

    @property
    def capacity_bytes(self) -> int:
        return int(self._buffer.total_bytes)

    def room(self, ptype: PageType) -> int:
        """Pages of `ptype` SGLang can allocate now (compacting the other end if it must)."""
        return int(self._ends[ptype].schedulable_available_size())

    def free_bytes(self) -> int:
        """The band between the two ends plus the holes lazy compaction left in them."""
        holes = sum(len(e._free_phys_pages) * int(e.entry_bytes) for e in self._ends.values())
        return int(self._full._current_gap_bytes()) + holes

    def wasted_bytes(self) -> int:
        """Neither held nor allocatable: the slot-0 sink (one state) and rounding at the top."""
        return self.capacity_bytes - self.held_bytes() - self.free_bytes()

    def kv_room_beside(self, states: int) -> int:
        """KV tokens an empty pool holds next to `states` states (SGLang's frontiers)."""
        full, mamba = self._full, self._mamba
        if states > mamba.num_pages - mamba.min_page_index:
            return -1
        mamba_top = (mamba.min_page_index + states) * mamba.entry_bytes
        lowest_kv = max(full.min_page_index, -(-mamba_top // full.entry_bytes))
        return int(full.num_pages - lowest_kv)

    def usage(self, ptype: PageType) -> Usage:
        used, evictable = self.used_count(ptype), self.evictable_count(ptype)
        free = self.room(ptype)  # one shared band: what SGLang could give this type alone
        return Usage(used + evictable + free, free, evictable, used, self.page_bytes(ptype))

    def fits(self, demand: Mapping[PageType, int], *, empty: bool = False) -> bool:
        """SGLang's admission rule on the unified allocator (see the module docstring)."""
        kv, states = demand.get(self.kv_type, 0), demand.get(self.state_type, 0)
        if empty:
            return kv <= self.kv_room_beside(states)
        cost = int(self._composite.mamba_slot_full_token_cost())
        kv_budget = int(self._composite.available_size()) + self.evictable_count(self.kv_type)
        state_budget = self.room(self.state_type) + self.evictable_count(self.state_type)
        return kv + states * cost <= kv_budget and states <= state_budget

    # ------------------------------------------------------------------ page moves

    def alloc(self, ptype: PageType, count: int, owner: int) -> Pages:
        if count < 0:
            raise ValueError(f"cannot allocate {count} pages")
        if count == 0:
            return IdPages([])
        if not self._could_ever_hold(ptype, count):
            raise OutOfMemory(f"{count} {ptype} pages exceed what SGLang's unified pool can hold")
        if not self._evict_until(ptype, lambda: self.room(ptype) >= count):
            raise OutOfMemory(
                f"{count} {ptype} pages: SGLang can allocate {self.room(ptype)} and nothing "
                "more is evictable"
            )
        got = self._sglang_alloc(ptype, count)
        if got is None:  # SGLang's own view promised the room: a modelling error, not OOM
            raise AssertionError(f"SGLang refused {count} {ptype} pages it said were free")
        ids = as_ids(got.numpy())
        self._take(ptype, ids)
        return SlotPages(ids)

    def _could_ever_hold(self, ptype: PageType, count: int) -> bool:
        """Whether an empty pool could serve the allocation (the contract's early refusal)."""
        if ptype == self.kv_type:
            return count <= self.kv_room_beside(0)
        return self.kv_room_beside(count) >= 0

    def _sglang_alloc(self, ptype: PageType, count: int) -> torch.Tensor | None:
        if ptype == self.kv_type:
            return self._composite.alloc(count)  # type: ignore[no-any-return]
        self._composite.prepare_mamba_allocation(count)
        return self._slots.alloc(count)  # type: ignore[no-any-return]

    def _give_back(self, ptype: PageType, ids: Ids) -> None:
        index = torch.from_numpy(ids)
        if ptype == self.kv_type:
            self._composite.free(index)  # compacts now, or leaves holes (lazy)
        else:
            self._slots.free(index)

    # ------------------------------------------------------------------ checks and counts

    def check_integrity(self) -> None:
        """Our ids against SGLang's: every held id is mapped, and SGLang has no other live
        pages (the memory is its only client); then SGLang's own byte accounting."""
        for ptype, end in self._ends.items():
            live = int(end.allocated_count())
            assert self.held(ptype) == live, f"{ptype}: we hold {self.held(ptype)}, SGLang {live}"
            ids = torch.tensor(sorted(self.held_ids(ptype)), dtype=torch.int64)
            if ids.numel():
                assert bool((end.virtual_to_physical[ids] >= 0).all()), f"{ptype}: unmapped ids"
        violations = self._composite.verify_byte_accounting()
        assert not violations, f"SGLang's byte accounting: {violations}"

    def moves(self) -> dict[str, int]:
        """What SGLang's compaction moved so far (its copies were skipped, not its moves)."""
        raw = self._buffer._raw
        kv = moves_of(raw, self.page_bytes(self.kv_type))
        st = moves_of(raw, self.page_bytes(self.state_type))
        return {
            "moved_kv_pages": kv.pages,
            "moved_state_pages": st.pages,
            "moved_bytes": kv.bytes + st.bytes,
            "move_copies": kv.copies + st.copies,
        }

    def __reduce__(self) -> tuple[Any, ...]:
        """A pickled copy (the alpha tuner's replay) is a detached `SlotMemory` model of the
        same bytes and held ids: it must never touch SGLang's allocators, nor carry the buffer."""
        sizes = {t: self.page_bytes(t) for t in self._ends}
        most = {t: int(e.num_pages - e.min_page_index) for t, e in self._ends.items()}
        shared = self.held_bytes() + self.free_bytes()  # the buffer less sink and rounding
        held = {t: (sorted(self.held_ids(t)), self.evictable_count(t)) for t in self._ends}
        return _detached, (most, sizes, shared, held), {"_evictor": self._evictor}


def _detached(
    most: dict[PageType, int],
    sizes: dict[PageType, int],
    shared: int,
    held: dict[PageType, tuple[list[int], int]],
) -> SlotMemory:
    copy = SlotMemory(most, sizes, sink=None, shared_bytes=shared)
    for ptype, (ids, evictable) in held.items():
        pages = copy.adopt(ptype, ids)
        if evictable:  # which ids are evictable is the copied tree's to know; the count is ours
            copy.mark_evictable(ptype, pages.split(evictable)[0])
    return copy


def unified_memory(
    spec: ModelSpec, budget_bytes: int, lazy_compaction: bool | None = None
) -> SglangUnifiedMemory:
    """SGLang's unified pool of `budget_bytes` for `spec`, as SGLang sizes it (the static
    split's Mamba slots on top of the token bytes). `lazy_compaction` None: SGLang's own
    default (`SGLANG_DISABLE_LAZY_COMPACTION` unset: lazy)."""
    if len(spec.attention_groups) != 1 or len(spec.mamba_groups) != 1:
        raise ValueError(
            f"{spec.name!r}: SGLang's unified pool is modelled for one attention group and one "
            "Mamba group"
        )
    if lazy_compaction is None:
        from sglang.srt.mem_cache.kv_cache_configurator import _should_enable_lazy_compaction

        lazy_compaction = bool(_should_enable_lazy_compaction())
    sglang_pools.server_args(unified=True, extra_buffer=False)
    split = static_split(spec, budget_bytes)
    # Request rows are never used here (the engine holds no req_to_token rows): one suffices.
    pools = sglang_pools.unified_pools(
        spec, split, 1, extra_buffer=False, lazy_compaction=lazy_compaction
    )
    return SglangUnifiedMemory(spec, pools)
