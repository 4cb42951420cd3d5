"""The contract between the radix tree and the memory that holds its pages.

The tree never owns bytes itself: every KV page and SSM state it caches was handed out by a
`CacheMemory`. Two memories implement the contract:

* `ByteBudget` (here): byte accounting only, Marconi's simulation method; pages are counts.
* `JengaPool` (jenga_sglang.pool): the two-level LCM pool with real small-page ids.

Direction of control: the memory decides *where* a page goes; when it is short, it calls back
into its `Evictor` (the tree), and the tree's policy decides *which cached entries* go. The
memory never drops a cached page on its own.

Small-page states: every page is either free, used (held by a running request or by a locked
node) or evictable (cached by an unlocked node). Conservation law, per page type:

    free + evictable + used == total
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from mypy_extensions import mypyc_attr

from jenga_sglang.radix.pages import CountPages, OutOfMemory, Pages, PageType, Usage


@mypyc_attr(allow_interpreted_subclasses=True)
class Evictor(ABC):
    """The owner of the cached pages (the tree). Called by the memory when it is short.

    A base class rather than a protocol: compiled (scripts/build_compiled.py), a call through a
    class is a direct call, through a protocol a generic method look-up, once per victim."""

    @abstractmethod
    def evict_for(self, ptype: PageType) -> bool:
        """Evict at least one cached entry: the eviction policy's next victim.

        `ptype` says which page type the memory is short of; the policy decides what goes, so
        one call may free pages of another type (the memory then asks again).

        Returns False when nothing is evictable any more.
        """


@mypyc_attr(allow_interpreted_subclasses=True)
class CacheMemory(ABC):
    """Memory that hands out small pages of several types to one tree.

    Contract:
    * `alloc` is atomic: it returns `count` pages or raises `OutOfMemory` having changed nothing
      but (possibly) evicted cached entries through the evictor. A request larger than what the
      memory could ever hold raises before evicting anything, naming the sizes.
    * Freshly allocated pages are *used*. The tree moves pages between used and evictable with
      `mark_evictable` / `mark_used` as locks come and go, and gives them back with `free`.
    """

    def __init__(self) -> None:
        self._evictor: Evictor | None = None

    def set_evictor(self, evictor: Evictor | None) -> None:
        self._evictor = evictor

    @property
    @abstractmethod
    def page_types(self) -> tuple[PageType, ...]: ...

    @abstractmethod
    def page_bytes(self, ptype: PageType) -> int:
        """Bytes of one small page of this type."""

    @abstractmethod
    def alloc(self, ptype: PageType, count: int, owner: int) -> Pages: ...

    def alloc_each(self, ptype: PageType, count: int, owner: int) -> list[Pages]:
        """`count` separate one-page allocations, all or nothing.

        Each page is allocated in turn (evicting as it needs); if one fails, the pages already
        taken are freed and OutOfMemory raised, the evictions made so far staying made.
        """
        return self.alloc_all([(ptype, 1)] * count, owner)

    def alloc_all(self, wants: Sequence[tuple[PageType, int]], owner: int) -> list[Pages]:
        """Pages for every (type, count) of `wants`, in order, all or nothing: if one fails,
        the pages already taken are freed and OutOfMemory raised, the evictions made so far
        staying made."""
        got: list[Pages] = []
        try:
            for ptype, count in wants:
                got.append(self.alloc(ptype, count, owner))
        except OutOfMemory:
            for (ptype, _), pages in zip(wants, got, strict=False):
                self.free(ptype, pages)
            raise
        return got

    def try_alloc_all(
        self, wants: Sequence[tuple[PageType, int]], owner: int
    ) -> list[Pages] | None:
        """`alloc_all`, or None where the pages do not fit (the evictions made stay made)."""
        try:
            return self.alloc_all(wants, owner)
        except OutOfMemory:
            return None

    @abstractmethod
    def free(self, ptype: PageType, pages: Pages) -> None:
        """Give back used pages (a request's pages that never reached the tree, duplicates)."""

    @abstractmethod
    def free_evictable(self, ptype: PageType, pages: Pages) -> None:
        """Give back evictable pages (the tree evicting a cached entry)."""

    @abstractmethod
    def mark_evictable(self, ptype: PageType, pages: Pages) -> None: ...

    @abstractmethod
    def mark_used(self, ptype: PageType, pages: Pages) -> None: ...

    @abstractmethod
    def usage(self, ptype: PageType) -> Usage: ...

    @property
    @abstractmethod
    def capacity_bytes(self) -> int: ...

    @abstractmethod
    def held_bytes(self) -> int:
        """Bytes in used or evictable pages (what counts against the budget)."""

    def wasted_bytes(self) -> int:
        """Bytes that are neither held nor allocatable to any type (fragmentation, padding)."""
        return 0

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise AssertionError when the conservation law or ownership is broken."""

    def fits(self, demand: Mapping[PageType, int], *, empty: bool = False) -> bool:
        """Whether `demand` more pages could be had on top of the used ones once everything
        evictable is evicted (with `empty`: in an empty memory). The engine admits on this.

        Here bytes are fungible across types (a byte budget, the Jenga pool): the demand's bytes
        against the capacity less used and wasted bytes. Memories with a fixed share per type
        (SGLang's static KV/Mamba split) check each type against its own share instead.
        """
        need = sum(count * self.page_bytes(t) for t, count in demand.items())
        if empty:
            return need <= self.capacity_bytes
        used = sum(self.usage(t).used * self.page_bytes(t) for t in self.page_types)
        return need <= self.capacity_bytes - used - self.wasted_bytes()

    def _evict_until(self, ptype: PageType, satisfied: object) -> bool:
        """Ask the evictor for entries until `satisfied()` holds; False if it ran dry."""
        assert callable(satisfied)
        while not satisfied():
            if self._evictor is None or not self._evictor.evict_for(ptype):
                return False
        return True


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class PageCount:
    """The pages of one type in a counted memory: how many are used and evictable, and the
    bytes of one. One object per type, so a page move looks its type up once."""

    __slots__ = ("evictable", "size", "used")

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self.evictable = 0


@mypyc_attr(allow_interpreted_subclasses=True)
class CountedMemory(CacheMemory):
    """Pages counted per type (no ids): `used` and `evictable` counters, the bytes they hold,
    and the page moves that keep them. Subclasses decide what an allocation may take (`alloc`,
    `usage`) and count what it takes with `_took`."""

    def __init__(self, capacity_bytes: int, page_sizes: Mapping[PageType, int]) -> None:
        super().__init__()
        self._capacity = capacity_bytes
        self._counts = {ptype: PageCount(size) for ptype, size in page_sizes.items()}
        self._held = 0  # bytes in used or evictable pages
        self._evictable_held = 0  # bytes in evictable pages (allocations check it every time)

    @property
    def page_types(self) -> tuple[PageType, ...]:
        return tuple(self._counts)

    def page_bytes(self, ptype: PageType) -> int:
        return self._counts[ptype].size

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    # The page moves run for every node locked, unlocked, inserted or evicted: each one does
    # its counting inline rather than through a shared helper (a call per move adds up).

    def free(self, ptype: PageType, pages: Pages) -> None:
        count, n = self._counts[ptype], len(pages)
        if count.used < n:
            _short(ptype, n, count.used)
        count.used -= n
        self._held -= n * count.size

    def free_evictable(self, ptype: PageType, pages: Pages) -> None:
        """Free pages that are currently evictable (the tree evicting a cached entry)."""
        count, n = self._counts[ptype], len(pages)
        if count.evictable < n:
            _short(ptype, n, count.evictable)
        count.evictable -= n
        self._held -= n * count.size
        self._evictable_held -= n * count.size

    def mark_evictable(self, ptype: PageType, pages: Pages) -> None:
        count, n = self._counts[ptype], len(pages)
        if count.used < n:
            _short(ptype, n, count.used)
        count.used -= n
        count.evictable += n
        self._evictable_held += n * count.size

    def mark_used(self, ptype: PageType, pages: Pages) -> None:
        count, n = self._counts[ptype], len(pages)
        if count.evictable < n:
            _short(ptype, n, count.evictable)
        count.evictable -= n
        count.used += n
        self._evictable_held -= n * count.size

    def held_bytes(self) -> int:
        return self._held

    def evictable_bytes(self) -> int:
        return self._evictable_held

    def _took(self, ptype: PageType, n: int) -> None:
        """Count `n` freshly allocated (used) pages of `ptype`."""
        count = self._counts[ptype]
        count.used += n
        self._held += n * count.size


def _short(ptype: PageType, n: int, there: int) -> None:
    raise AssertionError(f"moving {n} {ptype} pages but only {there} are there")


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class ByteBudget(CountedMemory):
    """Byte accounting with a hard budget: one page = one token of KV or one SSM state.

    `capacity_violations` counts moments when held bytes exceeded the budget; the allocator is
    built so that it stays 0 (tests and the simulator assert it).
    """

    def __init__(self, capacity_bytes: int, page_sizes: dict[PageType, int]) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity must be positive, got {capacity_bytes} bytes")
        if any(size <= 0 for size in page_sizes.values()):
            raise ValueError(f"page sizes must be positive: {page_sizes}")
        super().__init__(capacity_bytes, page_sizes)
        self.peak_bytes = 0
        self.capacity_violations = 0

    def alloc(self, ptype: PageType, count: int, owner: int) -> Pages:
        if count < 0:
            raise ValueError(f"cannot allocate {count} pages")
        need = count * self._counts[ptype].size
        if need > self._capacity:
            raise OutOfMemory(
                f"request for {count} {ptype} pages ({need} bytes) exceeds the whole budget "
                f"of {self._capacity} bytes"
            )
        if need > self._capacity - self._held + self.evictable_bytes():
            raise OutOfMemory(
                f"request for {count} {ptype} pages ({need} bytes): only "
                f"{self._capacity - self._held} bytes free and {self.evictable_bytes()} evictable "
                f"of {self._capacity}; the rest is in use"
            )
        if not self._make_room(ptype, need):
            raise OutOfMemory(f"evictor could not free {need} bytes for {count} {ptype} pages")
        self._took(ptype, count)
        self.peak_bytes = max(self.peak_bytes, self._held)
        if self._held > self._capacity:
            self.capacity_violations += 1
        return CountPages(count)

    def alloc_each(self, ptype: PageType, count: int, owner: int) -> list[Pages]:
        """`count` one-page allocations in turn, without a call per page when all fit.

        They fail at the first page beyond what free plus evictable bytes can hold (evicting
        does not change that sum): then the general loop runs. Otherwise each page evicts what
        it needs and is counted, as `alloc` would (the same victims and the same peak).
        """
        counted = self._counts[ptype]
        size = counted.size
        if count * size > self._capacity - self._held + self.evictable_bytes():
            return super().alloc_each(ptype, count, owner)
        for done in range(count):
            if self._held + size > self._capacity and not self._make_room(ptype, size):
                counted.used -= done
                self._held -= done * size
                raise OutOfMemory(f"evictor could not free {size} bytes for a {ptype} page")
            counted.used += 1
            self._held += size
            if self._held > self.peak_bytes:
                self.peak_bytes = self._held
        return [CountPages(1) for _ in range(count)]

    def _make_room(self, ptype: PageType, need: int) -> bool:
        """Evict until `need` more bytes fit in the budget; False if the evictor ran dry.

        `_evict_until` with the test inline: it runs once per victim, and vllm-blocks evicts
        about one node per state it allocates."""
        evictor = self._evictor
        while self._held + need > self._capacity:
            if evictor is None or not evictor.evict_for(ptype):
                return False
        return True

    def usage(self, ptype: PageType) -> Usage:
        count = self._counts[ptype]
        size, used, evictable = count.size, count.used, count.evictable
        free_pages = (self._capacity - self._held) // size  # if every free byte went to ptype
        return Usage(
            total=used + evictable + free_pages,
            free=free_pages,
            evictable=evictable,
            used=used,
            page_bytes=size,
        )

    def check_integrity(self) -> None:
        counts = self._counts.values()
        held = sum((c.used + c.evictable) * c.size for c in counts)
        assert held == self._held, f"held bytes drifted: counted {held}, tracked {self._held}"
        evictable = sum(c.evictable * c.size for c in counts)
        assert evictable == self._evictable_held, (
            f"evictable bytes drifted: counted {evictable}, tracked {self._evictable_held}"
        )
        assert 0 <= self._held <= self._capacity, (
            f"held {self._held} bytes outside [0, {self._capacity}]"
        )
        for ptype, c in self._counts.items():
            assert min(c.used, c.evictable) >= 0, f"{ptype}: {c.used} used, {c.evictable} evictable"
        assert self.capacity_violations == 0, f"{self.capacity_violations} capacity violations"
