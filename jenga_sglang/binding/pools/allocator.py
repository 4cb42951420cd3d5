"""SGLang's KV and Mamba slot allocator interfaces over one Jenga pool (pool/engine.py).

* `JengaTokenAllocator` is a `BaseTokenToKVPoolAllocator` (page size 1) over one KV page type
  of a Jenga pool: what the scheduler, the prefill budget and our backend call for KV token
  slots (binding/pools/swa_allocator.py puts two of them behind SGLang's SWA allocator).
* `JengaKVAllocator` is one beside Mamba states, with the shared-pool capability below.
* `JengaMambaAllocator` is a `MambaSlotAllocator`: what `HybridReqToTokenPool` calls for a
  request's state slot and its tracking slots, and what our backend frees states to.

Sizes follow SGLang's own unified allocators, so the scheduler's idle leak check
(`available + evictable + protected == size`) keeps proving conservation: KV's `size` is dynamic
(`available_size() + allocated`), and the Mamba allocator's `size` is the most states the buffer
could hold with `available_size() = size - allocated` (the planner reads
`schedulable_available_size()`, the states that can be taken now).

`mamba_full_cache_donor()` returns the KV allocator: our backend then models one shared byte
budget, as on `--enable-unified-memory` (binding/cache/backend.py), and tells it how many states its
tree holds (`attach_tree_states`), so the state reserve counts only what requests may still
demand (pool/shared.py). Its prefill budget (`create_prefill_budget`, binding/pools/budget.py)
admits by the KV the tree's evictable states would free too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.mamba import MambaSlotAllocator

from jenga_sglang.binding.pools.budget import SharedPoolBudget
from jenga_sglang.pool.engine import EnginePool
from jenga_sglang.pool.shared import SharedJengaPool
from jenga_sglang.radix.pages import PageType


def _ids(index: torch.Tensor) -> list[int]:
    return [int(i) for i in index.reshape(-1).tolist()]


class JengaTokenAllocator(BaseTokenToKVPoolAllocator):  # type: ignore[misc]  # sglang: no types
    """KV token slots of one page type of a Jenga pool: engine page e (one small page of the
    pool) holds slots [e * page_size, (e + 1) * page_size), as SGLang's paged allocator
    numbers them, page 0 being the sink."""

    def __init__(
        self,
        engine: EnginePool,
        ptype: PageType,
        kvcache: Any,
        dtype: torch.dtype,
        device: str,
        page_size: int = 1,
    ) -> None:
        slots = engine.max_ids(ptype) * page_size
        super().__init__(slots, page_size, dtype, device, kvcache, False)
        self.engine = engine
        self.kv_type = ptype
        # No free list of SGLang's kind: the invariant checker's free-page census then skips us.
        self.free_pages = None
        self.release_pages = None
        self.debug_mode = False  # SGLang's paged allocators' self-checks (read by SWA's frees)

    @property
    def size(self) -> int:
        # Same view as available_size(), so it cancels out of the scheduler's leak check.
        return int(self.available_size() + self.engine.allocated(self.kv_type) * self.page_size)

    @size.setter
    def size(self, value: int) -> None:
        pass  # the base __init__ and resize() write it; it is computed

    def available_size(self) -> int:
        return int(self.engine.available(self.kv_type)) * int(self.page_size)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """`need_size` slots in whole pages (a host load-back's KV), as SGLang's paged
        allocator hands them out: every slot of each page, page after page."""
        size = self.page_size
        if need_size % size:
            raise ValueError(f"{need_size} KV slots are not whole pages of {size}")
        pages = self.engine.alloc(self.kv_type, need_size // size)
        if pages is None:
            return None
        ids = np.asarray(pages, dtype=np.int64)[:, None] * size + np.arange(size)
        return torch.from_numpy(ids.reshape(-1)).to(self.device)

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
        **_: Any,
    ) -> torch.Tensor | None:
        """Slots for positions [prefix, seq) of each request: the rest of the page holding
        position prefix - 1 (slots after `last_loc`), then whole new pages."""
        return self._extend(prefix_lens_cpu.tolist(), seq_lens_cpu.tolist(), last_loc)

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, last_loc: torch.Tensor, **_: Any
    ) -> torch.Tensor | None:
        """One slot per request, for position seq - 1."""
        seq = seq_lens_cpu.tolist()
        return self._extend([n - 1 for n in seq], seq, last_loc)

    def _extend(
        self, starts: list[int], ends: list[int], last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        size = self.page_size
        new = sum(-(-e // size) - -(-s // size) for s, e in zip(starts, ends, strict=True))
        pages = self.engine.alloc(self.kv_type, new) if new else []
        if pages is None:
            return None
        last = last_loc.cpu().tolist()
        fresh = iter(pages)
        parts: list[np.ndarray[Any, np.dtype[np.int64]]] = []
        for start, end, loc in zip(starts, ends, last, strict=True):
            pos = start
            if pos % size:  # the request's partial page continues after its last slot
                n = min(end, pos - pos % size + size) - pos
                parts.append(np.arange(loc + 1, loc + 1 + n, dtype=np.int64))
                pos += n
            while pos < end:
                n = min(size, end - pos)
                first = next(fresh) * size
                parts.append(np.arange(first, first + n, dtype=np.int64))
                pos += n
        joined = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return torch.from_numpy(joined).to(self.device)

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(self._copy_for_free_group(free_index))
            return
        if self.page_size == 1:
            self.engine.free(self.kv_type, _ids(free_index))
        else:  # whole pages: every slot of a page a caller frees is its own
            self.free_page_ids(torch.unique(free_index // self.page_size))

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        self.engine.free(self.kv_type, _ids(page_ids))

    def clear(self) -> None:
        self.free_group = None
        self.engine.free_all(self.kv_type)

    def merge_and_sort_free(self) -> None:
        pass  # nothing is held back: frees reach the pool at once

    def get_all_free_pages(self) -> None:
        return None

    def get_cpu_copy(
        self, indices: Any, mamba_indices: Any = None, req_pool_index: Any = None
    ) -> Any:
        return self._kvcache.get_cpu_copy(
            indices, mamba_indices=mamba_indices, req_pool_index=req_pool_index
        )

    def load_cpu_copy(
        self,
        kv_cache_cpu: Any,
        indices: Any,
        mamba_indices: Any = None,
        req_pool_index: Any = None,
    ) -> Any:
        return self._kvcache.load_cpu_copy(
            kv_cache_cpu, indices, mamba_indices=mamba_indices, req_pool_index=req_pool_index
        )


class JengaKVAllocator(JengaTokenAllocator):
    """KV token slots (engine ids) beside Mamba states in one `SharedJengaPool`."""

    def __init__(
        self,
        shared: SharedJengaPool,
        kvcache: Any,
        dtype: torch.dtype,
        device: str,
        page_size: int = 1,
    ) -> None:
        super().__init__(shared, shared.kv_type, kvcache, dtype, device, page_size)
        self.shared = shared

    # ---- the shared-pool capability our backend (and SGLang's unified cache) looks for ----

    def mamba_full_cache_donor(self) -> JengaKVAllocator:
        return self

    def flush_deferred_full_frees(self) -> None:
        """Free KV slots held in an open free group now, keeping the group open."""
        pending = self.free_group
        if not pending:
            return
        self.free_group = None
        try:
            self.free(torch.cat(pending))
        finally:
            self.free_group = []

    def attach_tree_states(self, tree_states: Callable[[], int]) -> None:
        """`tree_states()`: states the prefix tree holds; the rest are requests' (shared.py)."""
        self.shared.attach_tree(tree_states)

    def create_prefill_budget(self, tree_cache: Any, *, num_mixed_decode_tokens: int = 0) -> Any:
        """SGLang's admission budget, counting the KV our tree's evictable states would free
        (binding/pools/budget.py); SGLang's own where the tree is not ours."""
        if not callable(getattr(tree_cache, "evictable_state_ids", None)):
            return super().create_prefill_budget(
                tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens
            )
        return SharedPoolBudget(self, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens)

    def full_tokens_before_mamba_recheck(self, target_size: int) -> int:
        return 0  # any freed KV page can complete a free large page

    def prepare_mamba_allocation(self, target_size: int) -> None:
        self.flush_deferred_full_frees()

    def debug_print(self) -> str:
        pool = self.shared.pool
        return (
            f"#kv-available={self.available_size()}, "
            f"#state-available={self.shared.room(self.shared.state_type)}, "
            f"#state-reserve={self.shared.reserve_needed()}/{self.shared.state_reserve}, "
            f"#free-large={pool.free_large_pages}/{pool.num_large}"
        )


class JengaMambaAllocator(MambaSlotAllocator):  # type: ignore[misc]  # sglang has no types
    """Mamba state slots (engine ids) from the shared Jenga pool."""

    def __init__(self, shared: SharedJengaPool, device: str) -> None:
        self.shared = shared
        self.state_type = shared.state_type
        super().__init__(shared.max_ids(shared.state_type), device)

    def available_size(self) -> int:
        # Conservation view for SGLang's leak check; the planner reads the next method.
        return int(self.size - self.shared.allocated(self.state_type))

    def schedulable_available_size(self) -> int:
        return self.shared.room(self.state_type)

    def _do_alloc(self, need_size: int) -> torch.Tensor | None:
        ids = self.shared.alloc(self.state_type, need_size)
        if ids is None:
            return None
        return torch.tensor(ids, dtype=torch.int64, device=self.device)

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel():
            self.shared.free(self.state_type, _ids(free_index))

    def clear(self) -> None:
        self._alloc_iter = None
        self.shared.free_all(self.state_type)

    @property
    def free_slots(self) -> torch.Tensor:
        """Ids not allocated (SGLang reads it only for a leak census): O(states)."""
        taken = set(self.shared.allocated_ids(self.state_type))
        free = [i for i in range(1, self.size + 1) if i not in taken]
        return torch.tensor(free, dtype=torch.int64, device=self.device)

    @free_slots.setter
    def free_slots(self, value: torch.Tensor) -> None:
        pass  # the base clear() would install a free list; the pool is the free list
