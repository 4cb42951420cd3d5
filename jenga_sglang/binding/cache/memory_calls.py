"""SGLang's calls on the memory of `JengaRadixCache`: locks, eviction, sizes, flags, and the
hooks of the Jenga pool's admission budget (binding/pools/budget.py).

Each call is a thin turn of the request into our tree (`PrefixCache`) or our slots
(slots/sglang_slots.py holds the rest: capacities, give-back, room, eviction goals).
`JengaRadixCache` (backend.py) takes these methods from here, so that module keeps the match,
the insert and the construction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    DecLockRefParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
)

from jenga_sglang.binding.cache.mamba_state import StateHandOver
from jenga_sglang.binding.slots.sglang_slots import SglangSlots
from jenga_sglang.binding.slots.tree import SlotTree
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import PageType


class MemoryCalls:
    """Locks, eviction, sizes and flags of `JengaRadixCache`, over the attributes it sets."""

    cache: PrefixCache
    slots: SglangSlots
    slot_tree: SlotTree
    handover: StateHandOver | None
    kv_type: PageType
    state_type: PageType | None
    owed_kv: int
    disable: bool

    if TYPE_CHECKING:  # defined by JengaRadixCache

        @property
        def root_node(self) -> Node: ...

        def sync_metrics(self) -> None: ...

    # ------------------------------------------------------------------ state slots

    def _try_alloc_state(self) -> int | None:
        assert self.handover is not None
        slot = self.handover.try_alloc_slot()
        return None if slot is None else int(slot.reshape(-1)[0].item())

    def _evict_states(self, count: int) -> None:
        assert self.state_type is not None
        self.slots.make_room(self.state_type, count)
        self.sync_metrics()

    # ------------------------------------------------------------------ locks and eviction

    def inc_lock_ref(self, node: Any) -> IncLockRefResult:
        before = self.slots.evictable_tokens()
        self.cache.pin(None if node is self.root_node else node)
        return IncLockRefResult(delta=self.slots.evictable_tokens() - before)

    def dec_lock_ref(self, node: Any, params: DecLockRefParams | None = None) -> DecLockRefResult:
        before = self.slots.evictable_tokens()
        self.cache.unpin(None if node is self.root_node else node)
        return DecLockRefResult(delta=self.slots.evictable_tokens() - before)

    def evict(self, params: EvictParams) -> EvictResult:
        """Make room for what SGLang is short of (slots/sglang_slots.py `SglangSlots.evict`)."""
        window = int(getattr(params, "swa_num_tokens", 0) or 0)
        kv, st, swa = self.slots.evict(params.num_tokens, params.mamba_num, window)
        self.sync_metrics()
        return EvictResult(num_tokens_evicted=kv, mamba_num_evicted=st, swa_num_tokens_evicted=swa)

    def path_device_indices(
        self, node: Any, start: int = 0, stop: int | None = None
    ) -> torch.Tensor:
        """KV slot ids of the path's positions [start, stop) (slots/tree.py)."""
        return self.slot_tree.path_ids(node, start, stop)

    # ------------------------------------------------------------------ sizes and flags

    def evictable_size(self) -> int:
        return self.slots.evictable_tokens()

    def full_evictable_size(self) -> int:
        return self.slots.evictable_tokens()

    def protected_size(self) -> int:
        return self.slots.protected_tokens()

    def full_protected_size(self) -> int:
        return self.protected_size()

    def swa_evictable_size(self) -> int:
        return self.slots.window_tokens("evictable")

    def swa_protected_size(self) -> int:
        return self.slots.window_tokens("used")

    def mamba_evictable_size(self) -> int:
        return self.slots.states("evictable")

    def mamba_protected_size(self) -> int:
        return self.slots.states("used")

    def owe_kv(self, tokens: int) -> None:
        """A request fits no admission with nothing running, short of `tokens` KV tokens even
        with every unlocked page counted (binding/pools/budget.py): its own cached path,
        locked while SGLang decides, pins the states on it. The next match, which SGLang
        makes with no lock of that request held, evicts that much first (`_pay_owed_kv`)."""
        self.owed_kv = max(self.owed_kv, tokens)

    def _pay_owed_kv(self) -> None:
        """Our policy's victims until SGLang can allocate `owed_kv` more KV tokens. Each
        stalled pass evicts at least what it was short of or empties the unlocked tree, and
        a victim of the request's own path that shortens its hit adds as much to its need as
        it frees, so a request that fits the pool is admitted after finitely many passes."""
        owed, self.owed_kv = self.owed_kv, 0
        self.slots.make_room(self.kv_type, self.slots.room(self.kv_type) + owed)
        self.sync_metrics()

    def evictable_state_ids(self) -> frozenset[int]:
        """Live state slots no lock holds: what the Jenga pool's admission budget counts as
        KV eviction can free (binding/pools/budget.py)."""
        return self.slot_tree.evictable_state_ids()

    def total_size(self) -> int:
        return self.slots.total_tokens()

    def supports_mamba(self) -> bool:
        return self.state_type is not None

    def supports_swa(self) -> bool:
        return self.slots.window is not None

    def supports_prefix_sharing(self) -> bool:
        return not self.disable
