"""SGLang's sliding-window KV pool as the memory of our tree's window group.

A hybrid-SWA model (gpt-oss) gets `SWATokenToKVPoolAllocator`: every token has a slot in the
full pool, which the request's `req_to_token` row holds, and a slot in the smaller SWA pool,
found through `full_to_swa_index_mapping[full]` (0 once freed). The window layers read a token's
KV through that mapping, so SGLang frees a running request's SWA slots once they fall out of
its window and keeps the full ones.

Our tree keeps one page run per attention group (radix/node.py): the full group holds full
slot ids, the window group the SWA slot ids of the tokens whose window KV it keeps (its
tombstones lead an edge). The invariant this module keeps:

    for every position the tree holds in both groups:  mapping[full id] == SWA id

so a request whose row is pointed at the tree's full ids reads the tree's window KV. New
positions arrive consistent (SGLang allocated them as a pair); a position whose tombstone the
tree revived with another request's window KV (radix/insert.py) is made consistent by
`publish`, which points the tree's full id at the SWA slot it adopted. `full_of` remembers,
per published SWA slot, the full id pointing at it, so freeing a window page (the tree
trimmed it) clears that pointer: no full id ever names a freed SWA slot.

Frees respect SGLang's free groups (the scheduler defers frees while a batch may still read
them): full slots through the full allocator, which defers them itself; SWA slots through the
composite allocator's own pile.
"""

from __future__ import annotations

from typing import Any

import torch

from jenga_sglang.binding.slots.ids import Ids


def is_window_allocator(allocator: Any) -> bool:
    """SGLang's hybrid-SWA allocator, with a separate paged SWA pool (not a per-request ring)."""
    return hasattr(allocator, "full_to_swa_index_mapping") and hasattr(
        allocator, "swa_attn_allocator"
    )


class WindowSlots:
    """The full and SWA pools of one `SWATokenToKVPoolAllocator` (see the module doc)."""

    def __init__(self, allocator: Any) -> None:
        if getattr(allocator, "swa_req_ring", False):
            raise NotImplementedError(
                "--enable-jenga: a per-request SWA ring (no SWA slots to share) is not served"
            )
        self.allocator = allocator
        self.mapping: torch.Tensor = allocator.full_to_swa_index_mapping
        self.device = self.mapping.device
        # The id spaces: the pools' rows (the Jenga pool's allocators report sizes that move).
        kvcache = allocator.get_kvcache()
        self.full_capacity, self.window_capacity = int(kvcache.size), int(kvcache.size_swa)
        size = self.window_capacity + int(allocator.page_size) + 1
        self.full_of = torch.zeros(size, dtype=torch.int64, device=self.device)

    def translate(self, full: torch.Tensor) -> torch.Tensor:
        """The SWA slots of full slots `full` (0 where SGLang freed them)."""
        return self.mapping[full.to(torch.int64)]

    def publish(self, full: torch.Tensor, window: torch.Tensor) -> None:
        """Point full slots at the SWA slots the tree holds for the same positions."""
        if window.numel():
            full = full.to(torch.int64)
            self.mapping[full] = window.to(self.mapping.dtype)
            self.full_of[window.to(torch.int64)] = full

    def release_window_of(self, full: torch.Tensor) -> None:
        """Free the SWA slots full slots `full` still name (a request's own, never the
        tree's): SGLang's `free_swa`, which clears the mapping."""
        full = full.to(torch.int64)
        named = full[self.mapping[full] > 0]
        if named.numel():
            self.allocator.free_swa(named)

    def free_full(self, ids: Ids) -> None:
        """Give full slots back. Their window KV is not freed here: every live SWA slot of a
        position the tree was handed is a window page of the tree's (or was refused and
        freed as one), which leaves as a page of its own; only the mapping is cleared."""
        index = torch.from_numpy(ids).to(self.device)
        self.allocator.clear_full_to_swa_mapping(index)
        self.allocator.free_full(index)

    def free_window(self, ids: Ids) -> None:
        """Give SWA slots the tree held back, clearing the full ids that name them."""
        window = torch.from_numpy(ids).to(self.device)
        full = self.full_of[window]
        named = self.mapping[full] == window
        self.allocator.clear_full_to_swa_mapping(full[named])
        self.full_of[window] = 0
        if self.allocator.free_group is not None:
            self.allocator.swa_free_group.append(window.clone())
        else:
            self.allocator.swa_attn_allocator.free(window)

    def alloc(self, full: bool, count: int) -> torch.Tensor | None:
        """`count` fresh full slots (`full`) or SWA slots (a host load-back's), None when the
        pool has not that many free. A fresh full slot names no SWA slot (its free cleared
        the mapping) until the load publishes the tree's window pages for it."""
        allocator = self.allocator
        pool = allocator.full_attn_allocator if full else allocator.swa_attn_allocator
        got: torch.Tensor | None = pool.alloc(count)
        return got

    def full_room(self) -> int:
        """Full slots SGLang can hand out now, frees held back in an open group included."""
        full = self.allocator.full_attn_allocator
        return int(full.available_size()) + _pending(getattr(full, "free_group", None))

    def window_room(self) -> int:
        pending = _pending(getattr(self.allocator, "swa_free_group", None))
        return int(self.allocator.swa_available_size()) + pending


def _pending(group: list[torch.Tensor] | None) -> int:
    return sum(int(t.numel()) for t in group or ())
