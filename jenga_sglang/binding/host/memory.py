"""Host memory of the live tier: one byte budget for every page type, and the bytes each id holds.

The tier (radix/host.py) allocates host pages here and `HostCopies` (binding/host/copies.py)
fills them. One budget for KV and states, no static split (docs/host-tier.md): an id of a type
takes that type's page bytes out of `capacity_bytes`, whatever the mix. Ids are reused once
freed, so the per-id maps below (and `HeldIds`' stamps) stay as long as the most ids ever held
at once, not the ids ever handed out.

Bytes are kept per move: the KV of one attention group of one demoted node is one `Block`, a
list of host tensors with a row per token; a checkpoint is a block whose data is what SGLang's
Mamba pool gives (`get_cpu_copy`). An id names its block and row. A block's tensors go when its
last id is freed. A split host node keeps its rows in the block; a node demoted onto a clean
copy (radix/host_copy.py) holds the copy's rows and the blocks written for what the copy
lacked, so a node's KV pages may lie in several blocks (`runs` groups them by block).

A pickled copy (the alpha tuner's replay) keeps the ids and drops the bytes (`detached`).
With KV events on, freed ids are reported to the recorder (`events`, binding/slots/kv_events.py):
a span a demoted page named goes only with its host copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from jenga_sglang.binding.slots.ids import Ids, SlotPages, page_ids
from jenga_sglang.binding.slots.kv_events import HitSpanEvents
from jenga_sglang.binding.slots.memory import SlotIdMemory
from jenga_sglang.radix.pages import OutOfMemory, Pages, PageType, Usage


class Block:
    """The bytes of one move: `data` (rows of every layer's tensors, or a pool's copy of a
    state) and how many of its ids are still held."""

    __slots__ = ("data", "live")

    def __init__(self, data: Any, live: int) -> None:
        self.data, self.live = data, live


class HostSlotMemory(SlotIdMemory):
    """`capacity_bytes` of host memory over page types of `page_bytes` each."""

    def __init__(self, capacity_bytes: int, page_bytes: Mapping[PageType, int]) -> None:
        super().__init__(page_bytes)
        if capacity_bytes <= 0:
            raise ValueError(f"host memory of {capacity_bytes} bytes must be > 0")
        if any(size <= 0 for size in page_bytes.values()):
            raise ValueError(f"page bytes must be > 0: {dict(page_bytes)}")
        self._capacity = capacity_bytes
        self._bytes = dict(page_bytes)
        self._spare: dict[PageType, list[int]] = {t: [] for t in page_bytes}
        self._next = dict.fromkeys(page_bytes, 0)
        self._block_of = {t: np.full(0, -1, np.int64) for t in page_bytes}
        self._row_of = {t: np.full(0, -1, np.int64) for t in page_bytes}
        self._blocks: dict[int, Block] = {}
        self._next_block = 0
        self.detached = False
        self.events: HitSpanEvents | None = None  # set by kv_events.attach when events are on

    # ------------------------------------------------------------------ CacheMemory

    def page_bytes(self, ptype: PageType) -> int:
        return self._bytes[ptype]

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    def alloc(self, ptype: PageType, count: int, owner: int) -> Pages:
        if count < 0:
            raise ValueError(f"cannot allocate {count} pages")
        need = count * self._bytes[ptype]
        if need > self._capacity:
            raise OutOfMemory(f"host {ptype}: {count} pages exceed {self._capacity} bytes")
        if not self._evict_until(ptype, lambda: self._capacity - self.held_bytes() >= need):
            raise OutOfMemory(f"host {ptype}: the evictor could not free {need} bytes")
        ids = self._fresh(ptype, count)
        self._take(ptype, ids)
        return SlotPages(ids)

    def usage(self, ptype: PageType) -> Usage:
        used, evictable = self.used_count(ptype), self.evictable_count(ptype)
        free = (self._capacity - self.held_bytes()) // self._bytes[ptype]
        return Usage(used + evictable + free, free, evictable, used, self._bytes[ptype])

    def check_integrity(self) -> None:
        """Within budget; every held id has its bytes and no bytes outlive their ids (between
        moves: a move fills its pages right after allocating them)."""
        held = self.held_bytes()
        assert held <= self._capacity, f"host: {held} bytes held > {self._capacity}"
        live = 0
        for ptype in self._bytes:
            assert 0 <= self.evictable_count(ptype) <= self.held(ptype), f"host {ptype} counts"
            filled = int((self._block_of[ptype] >= 0).sum())
            if not self.detached:
                assert filled == self.held(ptype), (
                    f"host {ptype}: {self.held(ptype)} ids held, {filled} with bytes"
                )
            live += filled
        assert live == sum(b.live for b in self._blocks.values()), "host: block counts"

    # ------------------------------------------------------------------ bytes

    def put(self, ptype: PageType, pages: Pages, data: Any) -> None:
        """Attach `data` (one row per page, in the pages' order) to freshly allocated pages."""
        ids = page_ids(pages)
        if not len(ids):
            return
        if (self._block_of[ptype][ids] >= 0).any():
            raise AssertionError(f"host {ptype}: pages {ids.tolist()} already hold bytes")
        number = self._next_block
        self._next_block += 1
        self._blocks[number] = Block(None if self.detached else data, len(ids))
        self._block_of[ptype][ids] = number
        self._row_of[ptype][ids] = np.arange(len(ids))

    def runs(self, ptype: PageType, pages: Pages) -> list[tuple[Any, np.ndarray, np.ndarray]]:
        """`pages` grouped by the block holding them: each block's data (what `put` gave it),
        the pages' rows in it, and their positions in `pages`."""
        ids = page_ids(pages)
        blocks = self._block_of[ptype][ids]
        if len(ids) and blocks.min() < 0:
            raise AssertionError(f"host {ptype}: pages {ids[blocks < 0].tolist()} hold no bytes")
        out = []
        for number in np.unique(blocks):
            data = self._blocks[int(number)].data
            if data is None:
                raise RuntimeError("host memory detached from its bytes (a pickled copy)")
            where = np.flatnonzero(blocks == number)
            out.append((data, self._row_of[ptype][ids[where]], where))
        return out

    # ------------------------------------------------------------------ ids

    def _fresh(self, ptype: PageType, count: int) -> Ids:
        spare = self._spare[ptype]
        reused = [spare.pop() for _ in range(min(count, len(spare)))]
        start = self._next[ptype]
        new = count - len(reused)
        self._next[ptype] = start + new
        if start + new > len(self._block_of[ptype]):
            grow = max(start + new, 2 * len(self._block_of[ptype]))
            for maps in (self._block_of, self._row_of):
                maps[ptype] = np.concatenate(
                    (maps[ptype], np.full(grow - len(maps[ptype]), -1, np.int64))
                )
        return np.concatenate(
            (np.array(reused, np.int64), np.arange(start, start + new, dtype=np.int64))
        )

    def _give_back(self, ptype: PageType, ids: Ids) -> None:
        if self.events is not None:
            self.events.host_freed(ptype, ids)  # ignored unless the keyed type: no list copy
        blocks = self._block_of[ptype][ids]
        for number, count in zip(*np.unique(blocks[blocks >= 0], return_counts=True), strict=True):
            block = self._blocks[int(number)]
            block.live -= int(count)
            if block.live == 0:
                del self._blocks[int(number)]
        self._block_of[ptype][ids] = -1
        self._row_of[ptype][ids] = -1
        self._spare[ptype].extend(ids.tolist())

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_blocks"] = {n: Block(None, b.live) for n, b in self._blocks.items()}
        state["detached"] = True
        state["events"] = None  # a replay's frees are not the server's
        return state
