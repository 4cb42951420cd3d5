"""SGLang's sliding-window allocator over one Jenga pool (pool/paired.py).

`JengaSWAAllocator` is an `SWATokenToKVPoolAllocator` whose two halves, the full-attention and
the sliding-window token allocators, draw pages of their own type from one `PairedJengaPool`
instead of two pools of a static ratio. Everything else is SGLang's own code: the
full-to-window slot mapping, `alloc` (a full and a window slot per token), `free` /
`free_swa` / `free_full`, free groups and the SWA prefill budget, which read the halves'
`available_size()`: both report the pairs that fit, so the budget never counts one free large
page for both halves.

Sizes are dynamic, as for the Mamba pool (binding/pools/allocator.py): `size_full` and
`size_swa` are each half's available plus allocated slots, and they are the capacities
SGLang's pool stats read (`swa_capacity_and_available`), so its usage figures and idle leak
checks keep proving conservation; the full-to-window mapping covers every full id the pool
could hand out.
"""

from __future__ import annotations

from typing import Any

import torch
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator

from jenga_sglang.binding.pools.allocator import JengaTokenAllocator
from jenga_sglang.pool.paired import PairedJengaPool


class JengaSWAAllocator(SWATokenToKVPoolAllocator):  # type: ignore[misc]  # sglang: no types
    """Full and window KV slots of a hybrid-SWA model from one `PairedJengaPool` (a small
    page of the pool holds `page_size` slots, SGLang's --page-size)."""

    def __init__(
        self,
        paired: PairedJengaPool,
        kvcache: Any,
        dtype: torch.dtype,
        device: str,
        page_size: int = 1,
    ) -> None:
        # Not SWATokenToKVPoolAllocator.__init__: it would build SGLang's two fixed pools.
        self.paired = paired
        self.dtype, self.device, self.page_size = dtype, device, page_size
        self.full_attn_allocator, self.swa_attn_allocator = (
            JengaTokenAllocator(paired, ptype, pool, dtype, device, page_size)
            for ptype, pool in (
                (paired.full_type, kvcache.full_kv_pool),
                (paired.window_type, kvcache.swa_kv_pool),
            )
        )
        full_slots = (paired.max_ids(paired.full_type) + 1) * page_size
        # Trailing -1: a last_loc of -1 (no prefix) reads it, as in SGLang's own allocator.
        self.full_to_swa_index_mapping = torch.cat(
            [
                torch.zeros(full_slots, dtype=torch.int64, device=device),
                torch.tensor([-1], dtype=torch.int64, device=device),
            ]
        )
        self.need_sort = False
        self.free_pages = None
        self.release_pages = None
        self.free_group = None
        self.swa_free_group: list[torch.Tensor] = []
        self.swa_page_ids_group: list[torch.Tensor] = []
        self._kvcache = kvcache
        self._swa_req_ring = False
        self._req_to_token_pool = None
        self._swa_ring_cost = 0
        self.clear()
        kvcache.register_mapping(self.full_to_swa_index_mapping)

    @property
    def size_full(self) -> int:
        return int(self.full_attn_allocator.size)

    @property
    def size_swa(self) -> int:
        return int(self.swa_attn_allocator.size)

    @property
    def size(self) -> int:
        return min(self.size_full, self.size_swa)

    def available_size(self) -> int:
        return self.paired.pairs() * self.page_size

    def swa_capacity_and_available(
        self, *, full_capacity: int, swa_capacity: int
    ) -> tuple[tuple[int, int], tuple[int, int]]:
        """(capacity, available) of each half for SGLang's pool stats: what each holds now
        plus the pairs still free, not the static split's counts its observer passes in. Its
        usage figures (requests' tokens over that) and idle leak checks then stay true."""
        full, swa = self.full_attn_allocator, self.swa_attn_allocator
        return (full.size, full.available_size()), (swa.size, swa.available_size())

    def resize(self, config: Any) -> None:
        raise NotImplementedError("the Jenga pool is sized once, at start-up")

    def debug_print(self) -> str:
        pool = self.paired.pool
        return (
            f"#pairs-available={self.paired.pairs()}, "
            f"#full-allocated={self.paired.allocated(self.paired.full_type)}, "
            f"#swa-allocated={self.paired.allocated(self.paired.window_type)}, "
            f"#free-large={pool.free_large_pages}/{pool.num_large}"
        )
