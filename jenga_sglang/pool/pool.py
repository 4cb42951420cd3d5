"""JengaPool: the two-level LCM pool as pure integer bookkeeping (no torch; layout.py holds bytes).

One buffer of `num_large = capacity // L` large pages. Small page i of type t sits at byte
i * s_t, so large page j holds small pages [j * L/s_t, (j+1) * L/s_t) of type t: each type sees a
uniformly strided array and kernels index it as usual (Jenga §4.2). A large page is either free
or carved into one type and associated with one owner (the request that carved it, §4.3). Small
pages are empty, evictable (cached, unreferenced) or used. When the last small page of a large
page becomes empty, the large page returns to the free list and can serve another type.

Allocation of one page of type t for owner r follows Jenga §5.4, adapted to our direction of
control. In the paper the allocator itself evicts LRU large pages (step 3) and LRU small pages
(step 5). Here the tree's policy owns every decision about *which cached entries* go; the pool
only says what it needs by calling `evictor.evict_for(t)`, and the tree frees pages back through
`free_evictable`:

  1. an empty page of type t in a large page associated with r;
  2. a free large page: carve it into t and associate it with r;
  3. if some carved large page holds no used page (only evictable, possibly some empty): ask the
     evictor until a large page is free (then step 1/2 again), no such large page remains, or the
     evictor runs dry;
  4. any empty page of type t (in another owner's large page);
  5. ask the evictor until an empty page of type t or a free large page exists; else OutOfMemory.

`request_aware=False` gives the naive allocator used as a contrast in the fragmentation
benchmark: any open large page of type t first, then a free one (no owner preference).

Byte accounting partitions the capacity:  held + wasted + free_large * L == capacity, where held
counts the payload of used and evictable pages, and wasted = empty small pages inside carved
large pages (fragmentation: unusable by other types) + padding of held pages + the capacity
remainder below one large page. Every hot path is O(1) amortised per page.
"""

from __future__ import annotations

from jenga_sglang.pool.sizing import PoolGeometry
from jenga_sglang.radix.memory import CacheMemory, IdPages, OutOfMemory, Pages, PageType, Usage

EMPTY, EVICTABLE, USED = 0, 1, 2
_STATE_NAMES = ("empty", "evictable", "used")


class JengaPool(CacheMemory):
    """Two-level pool over `geometry`; page ids are small-page indices within their type."""

    def __init__(
        self, geometry: PoolGeometry, capacity_bytes: int, *, request_aware: bool = True
    ) -> None:
        super().__init__()
        large = geometry.large_page_bytes
        if capacity_bytes < large:
            raise ValueError(
                f"capacity {capacity_bytes} bytes is smaller than one large page ({large} bytes)"
            )
        self.geometry = geometry
        self.request_aware = request_aware
        self.num_large = capacity_bytes // large
        self._capacity = capacity_bytes
        self._per = {tg.ptype: tg.per_large for tg in geometry.types}
        self._stride = {tg.ptype: tg.page_bytes for tg in geometry.types}
        self._data = {tg.ptype: tg.data_bytes for tg in geometry.types}
        self._state = {t: bytearray(self.num_large * n) for t, n in self._per.items()}
        n = self.num_large
        self._lp_type: list[PageType | None] = [None] * n
        self._lp_owner: list[int | None] = [None] * n
        self._lp_next = [0] * n  # bump pointer: offsets >= next were never taken since carving
        self._lp_stack: list[list[int]] = [[] for _ in range(n)]  # ids given back since carving
        self._lp_count = [[0, 0, 0] for _ in range(n)]  # empty / evictable / used small pages
        self._free_large = list(range(n - 1, -1, -1))  # stack: pops the lowest page first
        self._owner_open: dict[tuple[int, PageType], dict[int, None]] = {}
        self._type_open: dict[PageType, dict[int, None]] = {t: {} for t in self._per}
        self._carved = dict.fromkeys(self._per, 0)
        self._reclaimable = dict.fromkeys(self._per, 0)  # carved, no used page
        self._count = {t: [0, 0, 0] for t in self._per}  # per type, within carved pages

    # ---- CacheMemory queries ---------------------------------------------------------------

    @property
    def page_types(self) -> tuple[PageType, ...]:
        return self.geometry.page_types

    def page_bytes(self, ptype: PageType) -> int:
        return self._data[self._check_type(ptype)]

    def page_stride(self, ptype: PageType) -> int:
        """Bytes one page occupies in the buffer (payload plus padding)."""
        return self._stride[self._check_type(ptype)]

    def num_pages(self, ptype: PageType) -> int:
        """Size of the id space of `ptype` (pages if every large page went to it)."""
        return self.num_large * self._per[self._check_type(ptype)]

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def free_large_pages(self) -> int:
        return len(self._free_large)

    def owner_of(self, ptype: PageType, page: int) -> int | None:
        """Owner associated with the large page holding `page` (None when it is free)."""
        self._check_range(self._check_type(ptype), page)
        return self._lp_owner[page // self._per[ptype]]

    def usage(self, ptype: PageType) -> Usage:
        """Pages of `ptype`: free counts empty carved pages plus free large pages carved as it."""
        empty, evictable, used = self._count[self._check_type(ptype)]
        free = empty + len(self._free_large) * self._per[ptype]
        return Usage(free + evictable + used, free, evictable, used, self._data[ptype])

    def held_bytes(self) -> int:
        return sum((c[EVICTABLE] + c[USED]) * self._data[t] for t, c in self._count.items())

    def fragmentation_bytes(self) -> int:
        """Empty small pages inside carved large pages: only their own type can use them."""
        return sum(c[EMPTY] * self._stride[t] for t, c in self._count.items())

    def padding_bytes(self) -> int:
        """Padding inside held pages (alignment and granule)."""
        return sum(
            (c[EVICTABLE] + c[USED]) * (self._stride[t] - self._data[t])
            for t, c in self._count.items()
        )

    def remainder_bytes(self) -> int:
        return self._capacity - self.num_large * self.geometry.large_page_bytes

    def wasted_bytes(self) -> int:
        return self.fragmentation_bytes() + self.padding_bytes() + self.remainder_bytes()

    def snapshot(self) -> tuple[object, ...]:
        """Every page's state, type and owner: equal snapshots mean equal allocator states."""
        states = tuple(bytes(self._state[t]) for t in self.page_types)
        return (states, tuple(self._lp_type), tuple(self._lp_owner), sorted(self._free_large))

    # ---- allocation --------------------------------------------------------------------------

    def alloc(self, ptype: PageType, count: int, owner: int) -> Pages:
        self._check_type(ptype)
        if count < 0:
            raise ValueError(f"cannot allocate {count} pages of {ptype}")
        self._precheck(ptype, count)
        taken: list[int] = []
        try:
            for _ in range(count):
                taken.append(self._alloc_one(ptype, owner))
        except OutOfMemory:
            for page in reversed(taken):  # reverse order restores the free-list order too
                self._give_back(ptype, page)
            raise
        return IdPages(taken)

    def _precheck(self, t: PageType, count: int) -> None:
        per, stride = self._per[t], self._stride[t]
        if count > self.num_large * per:
            raise OutOfMemory(
                f"request for {count} {t} pages ({count * stride} bytes) exceeds the whole pool: "
                f"{self.num_large * per} pages of {stride} bytes in {self._capacity} bytes"
            )
        reachable = self._count[t][EMPTY] + len(self._free_large) * per
        if self._evictor is not None:
            other = sum(r for u, r in self._reclaimable.items() if u != t)
            reachable = (len(self._free_large) + other + self._carved[t]) * per - self._count[t][
                USED
            ]
        if count > reachable:
            raise OutOfMemory(
                f"request for {count} {t} pages ({count * stride} bytes): at most {reachable} "
                f"could be had after evicting everything evictable; the rest of the "
                f"{self._capacity}-byte pool is in use"
            )

    def _alloc_one(self, t: PageType, owner: int) -> int:
        page = self._from_own_or_free(t, owner)
        if page is None and self._evict_for_large(t):
            page = self._from_own_or_free(t, owner)  # step 3 done: back to steps 1-2
        if page is None:
            page = self._from_any(t)  # step 4
        if page is None and self._evict_until(t, lambda: self._type_open[t] or self._free_large):
            page = self._from_own_or_free(t, owner)  # step 5
            if page is None:
                page = self._from_any(t)
        if page is None:
            raise OutOfMemory(
                f"no {t} page ({self._stride[t]} bytes) could be freed: the evictor ran dry "
                f"with {self.held_bytes()} of {self._capacity} bytes held"
            )
        return page

    def _from_own_or_free(self, t: PageType, owner: int) -> int | None:
        if self.request_aware:
            own = self._owner_open.get((owner, t))
            if own:
                return self._take(next(iter(own)))
        elif self._type_open[t]:
            return self._take(next(iter(self._type_open[t])))
        if self._free_large:
            lp = self._free_large.pop()
            self._carve(lp, t, owner)
            return self._take(lp)
        return None

    def _from_any(self, t: PageType) -> int | None:
        open_pages = self._type_open[t]
        return self._take(next(iter(open_pages))) if open_pages else None

    def _evict_for_large(self, t: PageType) -> bool:
        while not self._free_large:
            if self._evictor is None or not any(self._reclaimable.values()):
                return False
            if not self._evictor.evict_for(t):
                return False
        return True

    # ---- state transitions ---------------------------------------------------------------------

    def _carve(self, lp: int, t: PageType, owner: int) -> None:
        self._lp_type[lp], self._lp_owner[lp] = t, owner
        self._lp_next[lp] = 0
        self._lp_stack[lp] = []
        self._carved[t] += 1
        self._shift(lp, t, None, EMPTY, self._per[t])

    def _take(self, lp: int) -> int:
        t = self._lp_type[lp]
        assert t is not None, f"large page {lp} is not carved"
        stack = self._lp_stack[lp]
        if stack:
            page = stack.pop()
        else:
            page = lp * self._per[t] + self._lp_next[lp]
            self._lp_next[lp] += 1
        self._state[t][page] = USED
        self._shift(lp, t, EMPTY, USED)
        return page

    def _give_back(self, t: PageType, page: int) -> None:
        lp = page // self._per[t]
        src = self._state[t][page]
        self._state[t][page] = EMPTY
        self._lp_stack[lp].append(page)
        self._shift(lp, t, src, EMPTY)
        if self._lp_count[lp][EMPTY] == self._per[t]:
            self._release(lp, t)

    def _release(self, lp: int, t: PageType) -> None:
        self._shift(lp, t, EMPTY, None, self._per[t])
        self._carved[t] -= 1
        self._lp_type[lp] = self._lp_owner[lp] = None
        self._lp_stack[lp] = []
        self._free_large.append(lp)

    def _shift(self, lp: int, t: PageType, src: int | None, dst: int | None, n: int = 1) -> None:
        """Move n small pages of large page lp from state src to dst (None: outside the pool)."""
        counts, totals = self._lp_count[lp], self._count[t]
        was_open, was_reclaimable = counts[EMPTY] > 0, self._is_reclaimable(counts)
        for state, delta in ((src, -n), (dst, n)):
            if state is not None:
                counts[state] += delta
                totals[state] += delta
        self._reclaimable[t] += self._is_reclaimable(counts) - was_reclaimable
        is_open = counts[EMPTY] > 0
        if is_open != was_open:
            self._set_open(lp, t, is_open)

    @staticmethod
    def _is_reclaimable(counts: list[int]) -> int:
        return int(counts[USED] == 0 and counts[EVICTABLE] > 0)

    def _set_open(self, lp: int, t: PageType, is_open: bool) -> None:
        owner = self._lp_owner[lp]
        assert owner is not None
        key = (owner, t)
        if is_open:
            self._type_open[t][lp] = None
            self._owner_open.setdefault(key, {})[lp] = None
            return
        del self._type_open[t][lp]
        own = self._owner_open[key]
        del own[lp]
        if not own:
            del self._owner_open[key]

    # ---- page moves requested by the tree --------------------------------------------------------

    def free(self, ptype: PageType, pages: Pages) -> None:
        for page in self._checked(ptype, pages, USED, "free"):
            self._give_back(ptype, page)

    def free_evictable(self, ptype: PageType, pages: Pages) -> None:
        for page in self._checked(ptype, pages, EVICTABLE, "free_evictable"):
            self._give_back(ptype, page)

    def mark_evictable(self, ptype: PageType, pages: Pages) -> None:
        self._mark(ptype, pages, USED, EVICTABLE, "mark_evictable")

    def mark_used(self, ptype: PageType, pages: Pages) -> None:
        self._mark(ptype, pages, EVICTABLE, USED, "mark_used")

    def _mark(self, t: PageType, pages: Pages, src: int, dst: int, op: str) -> None:
        state = self._state[t]
        for page in self._checked(t, pages, src, op):
            state[page] = dst
            self._shift(page // self._per[t], t, src, dst)

    def _checked(self, t: PageType, pages: Pages, expected: int, op: str) -> list[int]:
        """Validate every id before any state changes, so a bad call changes nothing."""
        self._check_type(t)
        ids = pages.ids()
        if len(set(ids)) != len(ids):
            raise ValueError(f"{op}({t}): duplicate page ids in {ids}")
        state = self._state[t]
        for page in ids:
            self._check_range(t, page)
            if self._lp_type[page // self._per[t]] != t or state[page] != expected:
                actual = self._describe(t, page)
                raise ValueError(
                    f"{op}({t}): page {page} is {actual}, expected {_STATE_NAMES[expected]}"
                )
        return ids

    def _describe(self, t: PageType, page: int) -> str:
        carved = self._lp_type[page // self._per[t]]
        if carved is None:
            return "in a free large page"
        if carved != t:
            return f"in a large page carved as {carved}"
        return _STATE_NAMES[self._state[t][page]]

    def _check_type(self, ptype: PageType) -> PageType:
        if ptype not in self._per:
            raise ValueError(f"unknown page type {ptype}; pool has {list(map(str, self._per))}")
        return ptype

    def _check_range(self, t: PageType, page: object) -> None:
        limit = self.num_large * self._per[t]
        if not isinstance(page, int) or isinstance(page, bool) or not 0 <= page < limit:
            raise ValueError(f"{t} page id {page!r} out of range [0, {limit})")

    # ---- integrity ----------------------------------------------------------------------------

    def check_integrity(self) -> None:
        from jenga_sglang.pool.integrity import check_pool

        check_pool(self)
