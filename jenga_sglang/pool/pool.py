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

from collections.abc import Iterable

from jenga_sglang.pool.bookkeeping import EMPTY, EVICTABLE, FREE, STATE_NAMES, USED, Books
from jenga_sglang.pool.sizing import PoolGeometry
from jenga_sglang.radix.memory import CacheMemory
from jenga_sglang.radix.pages import IdPages, OutOfMemory, Pages, PageType, Usage


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
        # Internals index types by position k (hashing a PageType costs more than the work).
        self._types = geometry.page_types
        self._index = {t: k for k, t in enumerate(self._types)}
        self._per = [tg.per_large for tg in geometry.types]
        self._stride = [tg.page_bytes for tg in geometry.types]
        self._data = [tg.data_bytes for tg in geometry.types]
        self._state = [bytearray(self.num_large * n) for n in self._per]
        n = self.num_large
        self._lp_type = [FREE] * n  # type index, or FREE
        self._lp_owner: list[int | None] = [None] * n
        self._lp_next = [0] * n  # bump pointer: offsets >= next were never taken since carving
        self._lp_stack: list[list[int]] = [[] for _ in range(n)]  # ids given back since carving
        self._lp_count = [[0, 0, 0] for _ in range(n)]  # empty / evictable / used small pages
        self._free_large = list(range(n - 1, -1, -1))  # stack: pops the lowest page first
        self._owner_open: dict[tuple[int, int], dict[int, None]] = {}
        self._type_open: list[dict[int, None]] = [{} for _ in self._types]
        self._carved = [0] * len(self._types)
        self._reclaimable = [0] * len(self._types)  # carved, evictable pages, no used page
        self._count = [[0, 0, 0] for _ in self._types]  # per type, within carved pages

    # ---- CacheMemory queries ---------------------------------------------------------------

    @property
    def page_types(self) -> tuple[PageType, ...]:
        return self._types

    def page_bytes(self, ptype: PageType) -> int:
        return self._data[self._k(ptype)]

    def page_stride(self, ptype: PageType) -> int:
        """Bytes one page occupies in the buffer (payload plus padding)."""
        return self._stride[self._k(ptype)]

    def num_pages(self, ptype: PageType) -> int:
        """Size of the id space of `ptype` (pages if every large page went to it)."""
        return self.num_large * self._per[self._k(ptype)]

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def free_large_pages(self) -> int:
        return len(self._free_large)

    def owner_of(self, ptype: PageType, page: int) -> int | None:
        """Owner associated with the large page holding `page` (None when it is free)."""
        k = self._k(ptype)
        self._check_range(k, page)
        return self._lp_owner[page // self._per[k]]

    def usage(self, ptype: PageType) -> Usage:
        """Pages of `ptype`: free counts empty carved pages plus free large pages carved as it."""
        k = self._k(ptype)
        empty, evictable, used = self._count[k]
        free = empty + len(self._free_large) * self._per[k]
        return Usage(free + evictable + used, free, evictable, used, self._data[k])

    def held_bytes(self) -> int:
        pairs = zip(self._count, self._data, strict=True)
        return sum((c[EVICTABLE] + c[USED]) * d for c, d in pairs)

    def fragmentation_bytes(self) -> int:
        """Empty small pages inside carved large pages: only their own type can use them."""
        return sum(c[EMPTY] * s for c, s in zip(self._count, self._stride, strict=True))

    def padding_bytes(self) -> int:
        """Padding inside held pages (alignment and granule)."""
        return sum(
            (c[EVICTABLE] + c[USED]) * (s - d)
            for c, s, d in zip(self._count, self._stride, self._data, strict=True)
        )

    def remainder_bytes(self) -> int:
        return self._capacity - self.num_large * self.geometry.large_page_bytes

    def wasted_bytes(self) -> int:
        return self.fragmentation_bytes() + self.padding_bytes() + self.remainder_bytes()

    def used_pages(self, ptype: PageType) -> list[int]:
        """Ids of the used pages of `ptype`, ascending (O(pages): for resets and censuses)."""
        state = self._state[self._k(ptype)]
        return [page for page, s in enumerate(state) if s == USED]

    def empty_pages(self, ptype: PageType) -> int:
        """Empty small pages of `ptype` inside large pages carved as it (no carving needed)."""
        return self._count[self._k(ptype)][EMPTY]

    def release_outcome(self, ptype: PageType, pages: Iterable[int]) -> tuple[int, int]:
        """What freeing `pages` (distinct, held pages of `ptype`) would do, with nothing moved:
        (large pages that would return to the free list, the change in `empty_pages(ptype)`:
        freed pages staying empty in large pages still carved, less the empty pages of those
        that return whole). O(len(pages))."""
        k = self._k(ptype)
        per, counts = self._per[k], self._lp_count
        freed: dict[int, int] = {}
        for page in pages:
            self._check_range(k, page)
            if self._state[k][page] == EMPTY or self._lp_type[page // per] != k:
                raise ValueError(f"{ptype} page {page} is not held ({self._describe(k, page)})")
            lp = page // per
            freed[lp] = freed.get(lp, 0) + 1
        whole = empty = 0
        for lp, n in freed.items():
            if n == per - counts[lp][EMPTY]:  # its last held pages: the large page is free
                whole += 1
                empty -= counts[lp][EMPTY]
            else:
                empty += n
        return whole, empty

    def snapshot(self) -> tuple[object, ...]:
        """Every page's state, type and owner: equal snapshots mean equal allocator states."""
        states = tuple(bytes(s) for s in self._state)
        return (states, tuple(self._lp_type), tuple(self._lp_owner), sorted(self._free_large))

    # ---- allocation --------------------------------------------------------------------------

    def alloc(self, ptype: PageType, count: int, owner: int) -> Pages:
        k = self._k(ptype)
        if count < 0:
            raise ValueError(f"cannot allocate {count} pages of {ptype}")
        self._precheck(k, count)
        taken: list[int] = []
        try:
            for _ in range(count):
                taken.append(self._alloc_one(k, owner))
        except OutOfMemory:
            for page in reversed(taken):  # reverse order restores the free-list order too
                self._give_back(k, page)
            raise
        return IdPages(taken)

    def _precheck(self, k: int, count: int) -> None:
        per, stride, t = self._per[k], self._stride[k], self._types[k]
        if count > self.num_large * per:
            raise OutOfMemory(
                f"request for {count} {t} pages ({count * stride} bytes) exceeds the whole pool: "
                f"{self.num_large * per} pages of {stride} bytes in {self._capacity} bytes"
            )
        reachable = self._count[k][EMPTY] + len(self._free_large) * per
        if self._evictor is not None:
            # After evicting everything: other types' large pages without used pages come back
            # whole, and every page of a type-k large page that is not used becomes empty.
            other = sum(self._reclaimable) - self._reclaimable[k]
            large = len(self._free_large) + other + self._carved[k]
            reachable = large * per - self._count[k][USED]
        if count > reachable:
            raise OutOfMemory(
                f"request for {count} {t} pages ({count * stride} bytes): at most {reachable} "
                f"could be had after evicting everything evictable; the rest of the "
                f"{self._capacity}-byte pool is in use"
            )

    def _alloc_one(self, k: int, owner: int) -> int:
        page = self._from_own_or_free(k, owner)  # steps 1-2
        if page is None and self._evict_for_large(k):
            page = self._from_own_or_free(k, owner)  # step 3 freed a large page
        if page is None:
            page = self._from_any(k)  # step 4
        if page is None and self._evict_until(
            self._types[k], lambda: self._type_open[k] or self._free_large
        ):
            page = self._from_own_or_free(k, owner)  # step 5
            if page is None:
                page = self._from_any(k)
        if page is None:
            raise OutOfMemory(
                f"no {self._types[k]} page ({self._stride[k]} bytes) could be freed: the "
                f"evictor ran dry with {self.held_bytes()} of {self._capacity} bytes held"
            )
        return page

    def _from_own_or_free(self, k: int, owner: int) -> int | None:
        if self.request_aware:
            own = self._owner_open.get((owner, k))
            if own:
                return self._take(next(iter(own)))
        elif self._type_open[k]:
            return self._take(next(iter(self._type_open[k])))
        if self._free_large:
            lp = self._free_large.pop()
            self._carve(lp, k, owner)
            return self._take(lp)
        return None

    def _from_any(self, k: int) -> int | None:
        open_pages = self._type_open[k]
        return self._take(next(iter(open_pages))) if open_pages else None

    def _evict_for_large(self, k: int) -> bool:
        while not self._free_large:
            if self._evictor is None or not any(self._reclaimable):
                return False
            if not self._evictor.evict_for(self._types[k]):
                return False
        return True

    # ---- state transitions ---------------------------------------------------------------------

    def _carve(self, lp: int, k: int, owner: int) -> None:
        self._lp_type[lp], self._lp_owner[lp] = k, owner
        self._lp_next[lp] = 0
        self._lp_stack[lp] = []
        self._carved[k] += 1
        self._shift(lp, k, None, EMPTY, self._per[k])

    def _take(self, lp: int) -> int:
        k = self._lp_type[lp]
        stack = self._lp_stack[lp]
        if stack:
            page = stack.pop()
        else:
            page = lp * self._per[k] + self._lp_next[lp]
            self._lp_next[lp] += 1
        self._state[k][page] = USED
        self._shift(lp, k, EMPTY, USED)
        return page

    def _give_back(self, k: int, page: int) -> None:
        lp = page // self._per[k]
        src = self._state[k][page]
        self._state[k][page] = EMPTY
        self._lp_stack[lp].append(page)
        self._shift(lp, k, src, EMPTY)
        if self._lp_count[lp][EMPTY] == self._per[k]:
            self._release(lp, k)

    def _release(self, lp: int, k: int) -> None:
        self._shift(lp, k, EMPTY, None, self._per[k])
        self._carved[k] -= 1
        self._lp_type[lp] = FREE
        self._lp_owner[lp] = None
        self._lp_stack[lp] = []
        self._free_large.append(lp)

    def _shift(self, lp: int, k: int, src: int | None, dst: int | None, n: int = 1) -> None:
        """Move n small pages of large page lp from state src to dst (None: outside the pool)."""
        counts, totals = self._lp_count[lp], self._count[k]
        was_open = counts[EMPTY] > 0
        was_reclaimable = counts[USED] == 0 and counts[EVICTABLE] > 0
        if src is not None:
            counts[src] -= n
            totals[src] -= n
        if dst is not None:
            counts[dst] += n
            totals[dst] += n
        self._reclaimable[k] += (counts[USED] == 0 and counts[EVICTABLE] > 0) - was_reclaimable
        if (counts[EMPTY] > 0) != was_open:
            self._set_open(lp, k, not was_open)

    def _set_open(self, lp: int, k: int, is_open: bool) -> None:
        owner = self._lp_owner[lp]
        assert owner is not None, f"carved large page {lp} has no owner"
        key = (owner, k)
        if is_open:
            self._type_open[k][lp] = None
            self._owner_open.setdefault(key, {})[lp] = None
            return
        del self._type_open[k][lp]
        own = self._owner_open[key]
        del own[lp]
        if not own:
            del self._owner_open[key]

    # ---- page moves requested by the tree --------------------------------------------------------

    def free(self, ptype: PageType, pages: Pages) -> None:
        k = self._k(ptype)
        for page in self._checked(k, pages, USED, "free"):
            self._give_back(k, page)

    def free_evictable(self, ptype: PageType, pages: Pages) -> None:
        k = self._k(ptype)
        for page in self._checked(k, pages, EVICTABLE, "free_evictable"):
            self._give_back(k, page)

    def mark_evictable(self, ptype: PageType, pages: Pages) -> None:
        self._mark(self._k(ptype), pages, USED, EVICTABLE, "mark_evictable")

    def mark_used(self, ptype: PageType, pages: Pages) -> None:
        self._mark(self._k(ptype), pages, EVICTABLE, USED, "mark_used")

    def _mark(self, k: int, pages: Pages, src: int, dst: int, op: str) -> None:
        state, per = self._state[k], self._per[k]
        for page in self._checked(k, pages, src, op):
            state[page] = dst
            self._shift(page // per, k, src, dst)

    def _checked(self, k: int, pages: Pages, expected: int, op: str) -> list[int]:
        """Validate every id before any state changes, so a bad call changes nothing."""
        ids = pages.ids()
        t = self._types[k]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{op}({t}): duplicate page ids in {ids}")
        state, per, lp_type = self._state[k], self._per[k], self._lp_type
        for page in ids:
            self._check_range(k, page)
            if lp_type[page // per] != k or state[page] != expected:
                raise ValueError(
                    f"{op}({t}): page {page} is {self._describe(k, page)}, "
                    f"expected {STATE_NAMES[expected]}"
                )
        return ids

    def _describe(self, k: int, page: int) -> str:
        carved = self._lp_type[page // self._per[k]]
        if carved == FREE:
            return "in a free large page"
        if carved != k:
            return f"in a large page carved as {self._types[carved]}"
        return STATE_NAMES[self._state[k][page]]

    def _k(self, ptype: PageType) -> int:
        k = self._index.get(ptype)
        if k is None:
            raise ValueError(f"unknown page type {ptype}; pool has {list(map(str, self._types))}")
        return k

    def _check_range(self, k: int, page: object) -> None:
        limit = self.num_large * self._per[k]
        if not isinstance(page, int) or isinstance(page, bool) or not 0 <= page < limit:
            raise ValueError(f"{self._types[k]} page id {page!r} out of range [0, {limit})")

    # ---- integrity ----------------------------------------------------------------------------

    def books(self) -> Books:
        """The bookkeeping itself (not copies), for the integrity check and tests."""
        return Books(
            self._per,
            self._state,
            self._lp_type,
            self._lp_owner,
            self._lp_next,
            self._lp_stack,
            self._lp_count,
            self._free_large,
            self._owner_open,
            self._type_open,
            self._carved,
            self._reclaimable,
            self._count,
        )

    def check_integrity(self) -> None:
        from jenga_sglang.pool.integrity import check_pool

        check_pool(self)
