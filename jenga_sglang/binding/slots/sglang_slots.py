"""SGLang's allocators as the memory of our tree: the glue around `SlotMemory`.

`SlotMemory` (slots/memory.py) keeps the accounting and knows nothing of SGLang; this module
builds it from the pools SGLang hands the backend (`CacheInitParams`) and answers what only
those pools know: how many slots of each type exist and what they weigh, how freed ids go back
to the allocator they came from, how many slots the engine can hand out right now, and how an
eviction SGLang asks for becomes victims of our policy.

On SGLang's unified pool (--enable-unified-memory) the allocator offers a "Mamba/Full donor":
KV and states share one byte buffer. The memory then models one shared budget, and the
engine's own free counts say when an allocation fits (`SlotMemory.make_room`).

With `--enable-int8-mamba-checkpoint` the tree's states are slots of SGLang's int8
`MambaCheckpointPool` (`checkpoints`, cache/mamba_state.py): the state type's capacity, frees
and room are that pool's, and the tree holds no live Mamba slot, so evicting it cannot make
room for one.

A hybrid-SWA model (gpt-oss) has two KV pools: the full one, whose slot ids a request's row
holds, and the sliding-window one (binding/slots/windows.py). The tree's full-attention group
holds full slots (`kv_type`) and its window group SWA slots (`window_type`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sglang.srt.mem_cache.cache_init_params import CacheInitParams

from jenga_sglang.binding.slots.ids import Ids
from jenga_sglang.binding.slots.kv_events import HitSpanEvents
from jenga_sglang.binding.slots.memory import SlotMemory
from jenga_sglang.binding.slots.windows import WindowSlots, is_window_allocator
from jenga_sglang.models.spec import AttentionGroup, ModelSpec
from jenga_sglang.radix.pages import PageKind, PageType


class SglangSlots:
    """The KV slots and Mamba slots of SGLang's pools, held by our tree through `memory`."""

    def __init__(self, params: CacheInitParams, spec: ModelSpec) -> None:
        self.spec = spec
        self.req_to_token_pool = params.req_to_token_pool
        self.allocator = params.token_to_kv_pool_allocator
        self.device = torch.device(getattr(self.allocator, "device", "cpu"))
        full, window = _full_and_window(spec)
        self.kv_type = PageType(PageKind.KV, spec.groups.index(full))
        self.window = WindowSlots(self.allocator) if is_window_allocator(self.allocator) else None
        if (window is None) != (self.window is None):
            raise NotImplementedError(
                f"--enable-jenga: {spec.name} has "
                f"{'a' if window else 'no'} sliding-window group, SGLang's allocator "
                f"{type(self.allocator).__name__} {'no' if window else 'a'} sliding-window pool"
            )
        self.window_type = (
            PageType(PageKind.KV, spec.groups.index(window)) if window is not None else None
        )
        self.window_group = window
        self.state_type = (
            PageType(PageKind.STATE, spec.groups.index(spec.mamba_groups[0]))
            if spec.has_mamba
            else None
        )
        self.checkpoints: Any = (
            getattr(self.req_to_token_pool, "mamba_ckpt_pool", None) if spec.has_mamba else None
        )
        donor = getattr(self.allocator, "mamba_full_cache_donor", None)
        self.donor = donor() if callable(donor) and self.state_type is not None else None
        capacity, page_bytes = self._capacity(), self._page_bytes()
        shared = max(n * page_bytes[t] for t, n in capacity.items()) if self.donor else None
        paired = getattr(self.allocator, "paired", None)  # the Jenga pool of an SWA model
        if paired is not None and self.window is not None:
            shared = int(paired.pool.capacity_bytes)
        self.events: HitSpanEvents | None = None  # set by kv_events.attach when events are on
        self.memory = SlotMemory(
            capacity, page_bytes, self.give_back, shared, self.room, self.allocate
        )
        attach = getattr(self.donor, "attach_tree_states", None)
        state_type = self.state_type
        if callable(attach) and state_type is not None:  # the Jenga pool (pool/shared.py):
            # its reserve nets request-held states; int8: the tree holds none of the pool's
            attach(lambda: 0 if self.checkpoints is not None else self.memory.held(state_type))

    def _capacity(self) -> dict[PageType, int]:
        if self.window is not None and self.window_type is not None:
            cap = {
                self.kv_type: self.window.full_capacity,
                self.window_type: self.window.window_capacity,
            }
        else:
            cap = {self.kv_type: int(self.allocator.size)}
        if self.checkpoints is not None and self.state_type is not None:
            cap[self.state_type] = int(self.checkpoints.num_slots)
        elif self.state_type is not None:
            cap[self.state_type] = int(self.req_to_token_pool.mamba_pool.size)
        return cap

    def _page_bytes(self) -> dict[PageType, int]:
        groups = self.spec.groups
        sizes = {
            t: g.kv_bytes_per_token
            for t in self.kv_types
            if isinstance(g := groups[t.group], AttentionGroup)
        }
        if self.state_type is not None:
            sizes[self.state_type] = self.spec.state_bytes
        return sizes

    @property
    def kv_types(self) -> tuple[PageType, ...]:
        """The full group's type, then the window group's (if any)."""
        return (self.kv_type,) if self.window_type is None else (self.kv_type, self.window_type)

    def give_back(self, ptype: PageType, ids: Ids) -> None:
        """Hand ids the tree freed to the SGLang allocator they came from (and their spans'
        removal to the event recorder, for the type whose slots name its spans: a state, or a
        KV page where hits need no state)."""
        if self.events is not None and ptype == self.events.keyed:
            self.events.freed(ids.tolist())
        if self.window is not None:
            if ptype == self.kv_type:
                self.window.free_full(ids)
                return
            if ptype == self.window_type:
                self.window.free_window(ids)
                return
        index = torch.from_numpy(ids).to(self.device)
        if ptype == self.kv_type:
            self.allocator.free(index)
        elif self.checkpoints is not None:
            self.checkpoints.free(index)
        else:
            self.req_to_token_pool.mamba_allocator.free(index)

    def allocate(self, ptype: PageType, count: int) -> Ids | None:
        """`count` slots of `ptype` from SGLang's allocator (a host hit's load-back); None when
        it has not that many free: KV (full or sliding-window), live Mamba slots, or int8
        checkpoint slots."""
        if self.window is not None and ptype in self.kv_types:
            got = self.window.alloc(ptype == self.kv_type, count)
        elif ptype == self.kv_type:
            got = self.allocator.alloc(count)
        elif ptype == self.state_type and self.checkpoints is not None:
            got = self.checkpoints.alloc(count)
        elif ptype == self.state_type:
            if self.donor is not None:
                self.donor.prepare_mamba_allocation(count)
            got = self.req_to_token_pool.mamba_allocator.alloc(count)
        else:
            raise NotImplementedError(f"allocating {ptype} slots for the tree")
        return None if got is None else got.reshape(-1).to(torch.int64).cpu().numpy()

    def free_states(self, ids: list[int]) -> None:
        """Give Mamba slots the tree never took back to SGLang."""
        if ids:
            self.req_to_token_pool.mamba_allocator.free(index_tensor(ids, self.device))

    def room(self, ptype: PageType) -> int:
        """Slots of `ptype` SGLang's allocators can hand out now, frees held back in an open
        free group included (the scheduler groups frees while it processes a batch)."""
        if self.donor is not None:
            self.donor.flush_deferred_full_frees()  # KV frees give the states their bytes
        if self.window is not None and ptype in self.kv_types:
            return self.window.full_room() if ptype == self.kv_type else self.window.window_room()
        if ptype == self.kv_type:
            group = getattr(self.allocator, "free_group", None) or ()
            pending = sum(int(t.numel()) for t in group)
            return int(self.allocator.available_size()) + pending
        if self.checkpoints is not None:
            return int(self.checkpoints.available_size())
        return int(self.req_to_token_pool.mamba_allocator.schedulable_available_size())

    def make_room(self, ptype: PageType, count: int) -> None:
        """Evict our policy's victims until SGLang can allocate `count` slots of `ptype`."""
        self.memory.make_room(ptype, count)
        if ptype == self.state_type and self.donor is not None:
            self.donor.prepare_mamba_allocation(count)  # SGLang's step before a state alloc

    def evict(self, num_tokens: int, mamba_num: int, window_tokens: int = 0) -> tuple[int, ...]:
        """Make room for `num_tokens` more KV slots, `mamba_num` more states and
        `window_tokens` more SWA slots than SGLang can allocate now (SGLang passes
        shortfalls); the KV slots, states and SWA slots freed. Victims come from our policy
        over every page type: on a unified pool a state's bytes may come from KV leaves and
        KV's from a dropped state. On separate pools this is "free that many slots of each
        type" (a short window pool first loses what lies out of every window, radix/evict.py
        `trim_window`)."""
        freed = dict(self.memory.freed_slots)
        # Targets first: on one shared pool freeing one type's pages makes room for the others,
        # and a shortfall is relative to the room SGLang saw. The window first: what it frees
        # first (out-of-window pages) loses the least.
        goals = [(self.window_type, window_tokens), (self.kv_type, num_tokens)]
        if self.checkpoints is None:  # SGLang asks for live slots, which int8's tree lacks
            goals.append((self.state_type, mamba_num))
        targets = [(t, self.room(t) + goal) for t, goal in goals if t is not None and goal > 0]
        for ptype, target in targets:
            self.make_room(ptype, target)
        return tuple(
            0 if t is None else self.memory.freed_slots[t] - freed[t]
            for t in (self.kv_type, self.state_type, self.window_type)
        )

    # ------------------------------------------------------------------ sizes SGLang reads

    def evictable_tokens(self) -> int:
        return self.memory.evictable_count(self.kv_type)  # a counter: called around every lock

    def protected_tokens(self) -> int:
        return self.memory.usage(self.kv_type).used

    def window_tokens(self, use: str) -> int:
        """SWA slots the tree holds, "evictable" or "used" (0 without a window group)."""
        if self.window_type is None:
            return 0
        usage = self.memory.usage(self.window_type)
        return usage.evictable if use == "evictable" else usage.used

    def states(self, use: str) -> int:
        """Mamba slots the tree holds, "evictable" or "used" (0 without a Mamba group)."""
        if self.state_type is None:
            return 0
        usage = self.memory.usage(self.state_type)
        return usage.evictable if use == "evictable" else usage.used

    def total_tokens(self) -> int:
        return self.memory.held(self.kv_type)

    def pool_bytes(self) -> dict[tuple[str, str], int]:
        """Bytes the tree holds per (page type, "used" or "evictable"), for the metrics."""
        pool: dict[tuple[str, str], int] = {}
        for ptype in self.memory.page_types:
            use = self.memory.usage(ptype)
            size = self.memory.page_bytes(ptype)
            pool[(str(ptype), "used")] = use.used * size
            pool[(str(ptype), "evictable")] = use.evictable * size
        return pool


def index_tensor(ids: list[int], device: Any) -> torch.Tensor:
    """Slot ids as an int64 tensor: through numpy, 4x faster than `torch.tensor` on a list
    (2 ms against 8.7 ms for 100k ids, on the scheduler thread)."""
    return torch.from_numpy(np.array(ids, dtype=np.int64)).to(device)


def _full_and_window(spec: ModelSpec) -> tuple[AttentionGroup, AttentionGroup | None]:
    """The full-attention group whose slots a request's row holds, and the sliding-window
    group (SGLang's SWA pool keeps one per model: every window layer shares it)."""
    attention = spec.attention_groups
    full = [g for g in attention if g.window is None]
    window = [g for g in attention if g.window is not None]
    if len(full) != 1 or len(window) > 1:
        raise NotImplementedError(
            f"--enable-jenga: {spec.name}: {len(full)} full-attention and {len(window)} "
            "sliding-window groups; SGLang's pools hold one of each"
        )
    return full[0], (window[0] if window else None)
