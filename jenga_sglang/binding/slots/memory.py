"""A `CacheMemory` over slots that SGLang's allocators own (no torch, no sglang).

In SGLang the engine allocates every KV slot and Mamba state slot before our tree sees it: a
running request writes its KV into slots from `TokenToKVPoolAllocator`, its state into a slot of
the Mamba pool, and `insert` hands those slot ids to the tree. So this memory *adopts* ids
instead of choosing them, and gives them back through a `SlotSink` (the backend turns the ids
into a tensor and calls the SGLang allocator's `free`). Ids travel as numpy arrays
(binding/slots/ids.py): a node's pages are one array, never a Python int per token.

Accounting per page type covers the slots the tree holds:

    used       slots of locked nodes (a running request reads them)
    evictable  slots of unlocked nodes
    free       capacity - used - evictable  (slots SGLang holds for running requests are
               outside the tree and count as free here; SGLang's allocator knows them)

so the tree's conservation law `free + evictable + used == total` holds by construction, and
ids enter once (`adopt`) and leave once (`free`), each checked there; `check_integrity` checks
the counters.

Two layouts of SGLang's memory:

* separate pools (the static split): each type has its own `capacity[t]` slots;
* one shared byte pool (`--enable-unified-memory`, `shared_bytes`): KV tokens and states take
  bytes of the same buffer, so evicting KV makes room for a state and dropping a state makes
  room for KV. `capacity[t]` is then the most slots of type t the buffer could hold, and what
  is free of each type is computed from the bytes not held (like `ByteBudget`).

When SGLang needs room (`make_room`), the question "can the engine allocate `count` more?" is
the engine's own: the backend passes `room`, SGLang's allocators' free counts, which see the
real layout (entry padding, reserved slots, compaction). The memory asks its evictor for
victims until that holds; the tree's policy picks them over every page type, so a state's bytes
may come from KV leaves and the other way round. Counting freed slots of the short type instead
would over-evict on a shared pool (a dropped state frees no KV *slots*, but 400 tokens of bytes).

`alloc` serves two callers. The live host tier (binding/host/) loads a hit back into slots the
engine allocates (`allocate`, after making room like any allocation). The offline alpha tuner
replays a window of requests on a pickled copy of the cache: there the copy hands out fresh
synthetic ids (never seen by SGLang) within the capacity, evicting through the tree like any
memory. A copy is detached from the sink and from the engine's allocators.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from jenga_sglang.binding.slots.ids import HeldIds, Ids, SlotPages, as_ids, page_ids
from jenga_sglang.radix.memory import CacheMemory
from jenga_sglang.radix.pages import OutOfMemory, Pages, PageType, Usage

SlotSink = Callable[[PageType, Ids], None]
Room = Callable[[PageType], int]  # slots of a type the engine can hand out right now
Allocate = Callable[[PageType, int], "Ids | None"]  # slots from the engine's allocators


class SlotIdMemory(CacheMemory):
    """A memory whose pages are SGLang slot ids, each either used (a request holds it) or
    evictable (only the tree does); `_give_back` hands freed ids to whatever allocator they
    came from.

    It keeps the ids it holds (`HeldIds`) and, per type, how many of them are evictable: a lock or
    an unlock moves a whole path between the two states, and counting it costs one addition
    where moving ids between two sets cost ~60 ns per token (the scheduler thread pays it on
    every request, 8 ms for a 128k-token path). Ids are touched only where they enter (`adopt`,
    which refuses an id held twice) and leave (`free`, which refuses one not held): linear in
    the tokens a request adds or the tree evicts. That a moved page was in the state it leaves
    is the tree's invariant (radix/integrity.py checks its unlocked pages against `usage`).
    """

    def __init__(self, page_types: Iterable[PageType]) -> None:
        super().__init__()
        self._held: dict[PageType, HeldIds] = {t: HeldIds() for t in page_types}
        self._evictable: dict[PageType, int] = dict.fromkeys(self._held, 0)

    @property
    def page_types(self) -> tuple[PageType, ...]:
        return tuple(self._held)

    def held_bytes(self) -> int:
        return sum(self.held(t) * self.page_bytes(t) for t in self._held)

    def held(self, ptype: PageType) -> int:
        return len(self._held[ptype])

    def evictable_count(self, ptype: PageType) -> int:
        return self._evictable[ptype]

    def used_count(self, ptype: PageType) -> int:
        return len(self._held[ptype]) - self._evictable[ptype]

    def held_ids(self, ptype: PageType) -> frozenset[int]:
        return self._held[ptype].ids()

    def free(self, ptype: PageType, pages: Pages) -> None:
        self._release(ptype, pages, evictable=False)

    def free_evictable(self, ptype: PageType, pages: Pages) -> None:
        self._release(ptype, pages, evictable=True)

    def mark_evictable(self, ptype: PageType, pages: Pages) -> None:
        self._move(ptype, len(pages))

    def mark_used(self, ptype: PageType, pages: Pages) -> None:
        self._move(ptype, -len(pages))

    def _move(self, ptype: PageType, count: int) -> None:
        after = self._evictable[ptype] + count
        if not 0 <= after <= len(self._held[ptype]):
            raise AssertionError(
                f"{ptype}: {abs(count)} pages moved, {self._evictable[ptype]} of "
                f"{len(self._held[ptype])} held were evictable"
            )
        self._evictable[ptype] = after

    def _take(self, ptype: PageType, ids: Ids) -> None:
        """Hold new ids (used), refusing any held already or given twice."""
        try:
            self._held[ptype].add(ids)
        except ValueError as exc:
            raise ValueError(f"{ptype}: {exc}") from None

    def _release(self, ptype: PageType, pages: Pages, *, evictable: bool) -> None:
        ids = page_ids(pages)
        if not len(ids):
            return
        held = self._held[ptype]
        if evictable and self._evictable[ptype] < len(ids):
            raise AssertionError(f"{ptype}: {len(ids)} evictable slots freed, fewer are evictable")
        if not evictable and len(held) - self._evictable[ptype] < len(ids):
            raise AssertionError(f"{ptype}: {len(ids)} used slots freed, fewer are used")
        try:
            held.remove(ids)
        except AssertionError as exc:
            raise AssertionError(f"{ptype}: {exc}") from None
        if evictable:
            self._move(ptype, -len(ids))
        self._give_back(ptype, ids)

    def __getstate__(self) -> dict[str, Any]:
        # Compiled (`make accelerate`), `CacheMemory` keeps its evictor in a native slot, out of
        # `__dict__`: a pickled copy (the alpha tuner's) would lose it, and its replays fail.
        return {**self.__dict__, "_evictor": self._evictor}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():  # setattr: a compiled base's slots included
            setattr(self, name, value)

    @abstractmethod
    def _give_back(self, ptype: PageType, ids: Ids) -> None:
        """Freed ids (already out of the held set) go back to their allocator."""


class SlotMemory(SlotIdMemory):
    """Slot ids adopted from SGLang; `capacity[t]` slots of `page_bytes[t]` bytes per type,
    all types drawing on `shared_bytes` when given (one unified buffer)."""

    def __init__(
        self,
        capacity: Mapping[PageType, int],
        page_bytes: Mapping[PageType, int],
        sink: SlotSink | None,
        shared_bytes: int | None = None,
        room: Room | None = None,
        allocate: Allocate | None = None,
    ) -> None:
        super().__init__(capacity)
        if set(capacity) != set(page_bytes):
            raise ValueError(
                f"capacity types {set(capacity)} != page_bytes types {set(page_bytes)}"
            )
        for ptype, n in capacity.items():
            if n <= 0 or page_bytes[ptype] <= 0:
                raise ValueError(
                    f"{ptype}: capacity {n} and page bytes {page_bytes[ptype]} must be > 0"
                )
        if shared_bytes is not None and shared_bytes <= 0:
            raise ValueError(f"shared pool of {shared_bytes} bytes must be > 0")
        self._capacity = dict(capacity)
        self._bytes = dict(page_bytes)
        self._shared = shared_bytes
        self._room = room
        self._allocate = allocate
        self._sink = sink
        self._next_synthetic = -1
        self.freed_slots = dict.fromkeys(capacity, 0)

    # ------------------------------------------------------------------ engine side

    def adopt(self, ptype: PageType, ids: Iterable[int] | npt.NDArray[np.integer]) -> Pages:
        """Take over slots SGLang allocated (they become used pages of the caller)."""
        got = as_ids(ids)
        if not len(got):
            return SlotPages(got)
        if self.held(ptype) + len(got) > self._capacity[ptype]:
            raise OutOfMemory(f"{ptype}: adopting {len(got)} slots exceeds {self._capacity[ptype]}")
        self._take(ptype, got)
        return SlotPages(got)

    def room(self, ptype: PageType) -> int:
        """Slots of `ptype` that can be allocated now: the engine's count when attached,
        else this memory's own model (a detached copy in a tuner replay)."""
        return self._room(ptype) if self._room is not None else self._model_room(ptype)

    def make_room(self, ptype: PageType, count: int) -> bool:
        """Evict the policy's victims until `count` slots of `ptype` can be allocated;
        False if the tree ran out of victims first."""
        return self._evict_until(ptype, lambda: self.room(ptype) >= count)

    def _model_room(self, ptype: PageType) -> int:
        room = self._capacity[ptype] - self.held(ptype)
        if self._shared is not None:
            room = min(room, (self._shared - self.held_bytes()) // self._bytes[ptype])
        return max(0, room)

    # ------------------------------------------------------------------ CacheMemory

    def page_bytes(self, ptype: PageType) -> int:
        return self._bytes[ptype]

    @property
    def capacity_bytes(self) -> int:
        if self._shared is not None:
            return self._shared
        return sum(n * self._bytes[t] for t, n in self._capacity.items())

    def alloc(self, ptype: PageType, count: int, owner: int) -> Pages:
        if count < 0:
            raise ValueError(f"cannot allocate {count} pages")
        if count > self._capacity[ptype]:
            raise OutOfMemory(f"{ptype}: {count} pages exceed the capacity {self._capacity[ptype]}")
        if self._allocate is not None:
            return self._engine_alloc(ptype, count)
        if not self._evict_until(ptype, lambda: self._model_room(ptype) >= count):
            raise OutOfMemory(f"{ptype}: evictor could not make room for {count} pages")
        ids = np.arange(self._next_synthetic, self._next_synthetic - count, -1, dtype=np.int64)
        self._next_synthetic -= count
        self._take(ptype, ids)
        return SlotPages(ids)

    def _engine_alloc(self, ptype: PageType, count: int) -> Pages:
        """`count` slots from the engine's allocator, evicting first as SGLang's own
        allocation would (used pages of the caller)."""
        assert self._allocate is not None
        if not self.make_room(ptype, count):
            raise OutOfMemory(f"{ptype}: evictor could not make room for {count} slots")
        ids = self._allocate(ptype, count)
        if ids is None or len(ids) != count:
            raise OutOfMemory(f"{ptype}: the engine's allocator did not give {count} slots")
        self._take(ptype, ids)
        return SlotPages(ids)

    def usage(self, ptype: PageType) -> Usage:
        used, evictable = self.used_count(ptype), self.evictable_count(ptype)
        free = self._model_room(ptype)  # on a shared pool: if every free byte went to ptype
        return Usage(used + evictable + free, free, evictable, used, self._bytes[ptype])

    def check_integrity(self) -> None:
        for ptype, total in self._capacity.items():
            assert self.held(ptype) <= total, f"{ptype}: {self.held(ptype)} slots held > {total}"
            evictable = self.evictable_count(ptype)
            assert 0 <= evictable <= self.held(ptype), f"{ptype}: {evictable} evictable slots"

    # ------------------------------------------------------------------ helpers

    def _give_back(self, ptype: PageType, ids: Ids) -> None:
        real = ids if int(ids.min()) >= 0 else ids[ids >= 0]  # synthetic ids (tuner
        if len(real) and self._sink is not None:  # replays) never reach SGLang
            self._sink(ptype, real)
        self.freed_slots[ptype] += len(ids)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_sink"] = None  # a copy (tuner replay) must never free SGLang's slots
        state["_room"] = None  # ... nor read SGLang's allocators: it models its own room
        state["_allocate"] = None  # ... nor take their slots
        return state
