"""A `CacheMemory` over slots that SGLang's allocators own (no torch, no sglang).

In SGLang the engine allocates every KV slot and Mamba state slot before our tree sees it: a
running request writes its KV into slots from `TokenToKVPoolAllocator`, its state into a slot of
the Mamba pool, and `insert` hands those slot ids to the tree. So this memory *adopts* ids
instead of choosing them, and gives them back through a `SlotSink` (the backend turns the ids
into a tensor and calls the SGLang allocator's `free`).

Accounting per page type covers the slots the tree holds:

    used       slots of locked nodes (a running request reads them)
    evictable  slots of unlocked nodes
    free       capacity - used - evictable  (slots SGLang holds for running requests are
               outside the tree and count as free here; SGLang's allocator knows them)

so the tree's conservation law `free + evictable + used == total` holds by construction, and
`check_integrity` verifies that no slot id is held twice and that the counters match the ids.

`alloc` serves the offline alpha tuner, which replays a window of requests on a pickled copy of
the cache: there the copy hands out fresh synthetic ids (never seen by SGLang) within the
capacity, evicting through the tree like any memory. A copy is detached from the sink.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jenga_sglang.radix.memory import CacheMemory, IdPages, OutOfMemory, Pages, PageType, Usage

SlotSink = Callable[[PageType, list[int]], None]


class SlotMemory(CacheMemory):
    """Slot ids adopted from SGLang; `capacity[t]` slots of `page_bytes[t]` bytes per type."""

    def __init__(
        self,
        capacity: Mapping[PageType, int],
        page_bytes: Mapping[PageType, int],
        sink: SlotSink | None,
    ) -> None:
        super().__init__()
        if set(capacity) != set(page_bytes):
            raise ValueError(
                f"capacity types {set(capacity)} != page_bytes types {set(page_bytes)}"
            )
        for ptype, n in capacity.items():
            if n <= 0 or page_bytes[ptype] <= 0:
                raise ValueError(
                    f"{ptype}: capacity {n} and page bytes {page_bytes[ptype]} must be > 0"
                )
        self._capacity = dict(capacity)
        self._bytes = dict(page_bytes)
        self._used: dict[PageType, set[int]] = {t: set() for t in capacity}
        self._evictable: dict[PageType, set[int]] = {t: set() for t in capacity}
        self._sink = sink
        self._next_synthetic = -1
        self.freed_slots = dict.fromkeys(capacity, 0)

    # ------------------------------------------------------------------ engine side

    def adopt(self, ptype: PageType, ids: Iterable[int]) -> Pages:
        """Take over slots SGLang allocated (they become used pages of the caller)."""
        got = list(ids)
        used = self._used[ptype]
        clash = used.intersection(got) | self._evictable[ptype].intersection(got)
        if clash or len(set(got)) != len(got):
            raise ValueError(f"{ptype}: slots {sorted(clash)[:5] or got[:5]} adopted twice")
        if len(used) + len(self._evictable[ptype]) + len(got) > self._capacity[ptype]:
            raise OutOfMemory(f"{ptype}: adopting {len(got)} slots exceeds {self._capacity[ptype]}")
        used.update(got)
        return IdPages(got)

    def held(self, ptype: PageType) -> int:
        return len(self._used[ptype]) + len(self._evictable[ptype])

    # ------------------------------------------------------------------ CacheMemory

    @property
    def page_types(self) -> tuple[PageType, ...]:
        return tuple(self._capacity)

    def page_bytes(self, ptype: PageType) -> int:
        return self._bytes[ptype]

    @property
    def capacity_bytes(self) -> int:
        return sum(n * self._bytes[t] for t, n in self._capacity.items())

    def held_bytes(self) -> int:
        return sum(self.held(t) * self._bytes[t] for t in self._capacity)

    def alloc(self, ptype: PageType, count: int, owner: int) -> Pages:
        if count < 0:
            raise ValueError(f"cannot allocate {count} pages")
        if count > self._capacity[ptype]:
            raise OutOfMemory(f"{ptype}: {count} pages exceed the capacity {self._capacity[ptype]}")
        ok = self._evict_until(ptype, lambda: self.held(ptype) + count <= self._capacity[ptype])
        if not ok:
            raise OutOfMemory(f"{ptype}: evictor could not make room for {count} pages")
        ids = list(range(self._next_synthetic, self._next_synthetic - count, -1))
        self._next_synthetic -= count
        self._used[ptype].update(ids)
        return IdPages(ids)

    def free(self, ptype: PageType, pages: Pages) -> None:
        self._release(ptype, pages, self._used[ptype])

    def free_evictable(self, ptype: PageType, pages: Pages) -> None:
        self._release(ptype, pages, self._evictable[ptype])

    def mark_evictable(self, ptype: PageType, pages: Pages) -> None:
        self._move(pages, self._used[ptype], self._evictable[ptype], ptype)

    def mark_used(self, ptype: PageType, pages: Pages) -> None:
        self._move(pages, self._evictable[ptype], self._used[ptype], ptype)

    def usage(self, ptype: PageType) -> Usage:
        used, evictable = len(self._used[ptype]), len(self._evictable[ptype])
        total = self._capacity[ptype]
        return Usage(total, total - used - evictable, evictable, used, self._bytes[ptype])

    def check_integrity(self) -> None:
        for ptype, total in self._capacity.items():
            both = self._used[ptype] & self._evictable[ptype]
            assert not both, f"{ptype}: slots {sorted(both)[:5]} both used and evictable"
            assert self.held(ptype) <= total, f"{ptype}: {self.held(ptype)} slots held > {total}"

    # ------------------------------------------------------------------ helpers

    def _release(self, ptype: PageType, pages: Pages, src: set[int]) -> None:
        ids = pages.ids()
        self._move(pages, src, None, ptype)
        real = [i for i in ids if i >= 0]  # synthetic ids (tuner replays) never reach SGLang
        if real and self._sink is not None:
            self._sink(ptype, real)
        self.freed_slots[ptype] += len(ids)

    @staticmethod
    def _move(pages: Pages, src: set[int], dst: set[int] | None, ptype: PageType) -> None:
        ids = pages.ids()
        missing = [i for i in ids if i not in src]
        if missing:
            raise AssertionError(f"{ptype}: slots {missing[:5]} are not in the expected state")
        src.difference_update(ids)
        if dst is not None:
            dst.update(ids)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_sink"] = None  # a copy (tuner replay) must never free SGLang's slots
        return state
