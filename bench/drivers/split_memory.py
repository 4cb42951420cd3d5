"""SGLang's static KV/Mamba split as a cache memory the engine and the tree can drive.

`sglang_split.static_split` says how many KV token slots and Mamba state slots SGLang 0.5.23
carves out of one byte budget (`--mamba-full-memory-ratio`, 0.9 by default). This memory hands
out exactly those slots: every attention group gets `kv_tokens` one-token pages (in SGLang one
token slot holds the token's K and V in every full-attention layer), the SSM state type gets
`mamba_slots` pages. The two pools never lend to each other: a KV allocation fails when the KV
pool is short even if Mamba slots sit free, and the other way round. That is the difference from
the Jenga pool, whose large pages go to whichever type needs them.

Running requests and cached entries share each pool (SGLang keeps no separate checkpoint pool);
when a pool is short the tree's eviction policy picks victims (`Evictor.evict_for`), as for the
other memories. Bytes SGLang's split leaves unassigned (the Mamba pool's padding slot, the
remainders below one slot) are `wasted_bytes`.
"""

from __future__ import annotations

from collections.abc import Mapping

from jenga_sglang.bench.drivers.sglang_split import (
    DEFAULT_MAMBA_FULL_MEMORY_RATIO,
    SglangSplit,
    static_split,
)
from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.radix.memory import CountedMemory
from jenga_sglang.radix.pages import CountPages, OutOfMemory, PageKind, Pages, PageType, Usage


class StaticSplitMemory(CountedMemory):
    """Fixed page counts per type; one page = one token of KV (per group) or one SSM state."""

    def __init__(self, capacity_bytes: int, pages: Mapping[PageType, tuple[int, int]]) -> None:
        """`pages[t]` = (number of pages, bytes per page) of type t."""
        if any(n <= 0 or size <= 0 for n, size in pages.values()):
            raise ValueError(f"page counts and sizes must be positive: {dict(pages)}")
        assigned = sum(n * size for n, size in pages.values())
        if assigned > capacity_bytes:
            raise ValueError(f"pools of {assigned} bytes exceed the budget of {capacity_bytes}")
        super().__init__(capacity_bytes, {t: size for t, (_, size) in pages.items()})
        self._total = {t: n for t, (n, _) in pages.items()}
        self._wasted = capacity_bytes - assigned

    # ---- queries -----------------------------------------------------------------------------

    def pool_bytes(self, kind: PageKind) -> int:
        """Bytes assigned to the pools of one kind (KV or SSM state)."""
        return sum(n * self.page_bytes(t) for t, n in self._total.items() if t.kind is kind)

    def wasted_bytes(self) -> int:
        return self._wasted

    def usage(self, ptype: PageType) -> Usage:
        total, count = self._total[ptype], self._counts[ptype]
        free = total - count.used - count.evictable
        return Usage(total, free, count.evictable, count.used, count.size)

    def fits(self, demand: Mapping[PageType, int], *, empty: bool = False) -> bool:
        """Each type against its own pool: free Mamba slots do not hold KV, nor the reverse."""
        return all(
            count <= self._total[t] - (0 if empty else self._counts[t].used)
            for t, count in demand.items()
        )

    # ---- allocation (page moves: CountedMemory) -------------------------------------------

    def alloc(self, ptype: PageType, count: int, owner: int) -> Pages:
        if count < 0:
            raise ValueError(f"cannot allocate {count} pages")
        total, counted = self._total[ptype], self._counts[ptype]
        if count > total - counted.used:
            raise OutOfMemory(
                f"request for {count} {ptype} pages: its pool holds {total} pages of "
                f"{counted.size} bytes and {counted.used} are in use (static split: "
                "the other pool's free pages cannot serve it)"
            )
        if not self._evict_until(ptype, lambda: self.usage(ptype).free >= count):
            raise OutOfMemory(f"evictor could not free {count} {ptype} pages")
        self._took(ptype, count)
        return CountPages(count)

    def check_integrity(self) -> None:
        for t, total in self._total.items():
            used, evictable = self._counts[t].used, self._counts[t].evictable
            assert used >= 0 and evictable >= 0, f"{t}: used {used}, evictable {evictable}"
            assert used + evictable <= total, f"{t}: {used} + {evictable} pages > pool of {total}"


def split_memory(
    spec: ModelSpec, budget_bytes: int, ratio: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO
) -> StaticSplitMemory:
    """The static split SGLang makes of `budget_bytes` for `spec` (one Mamba group)."""
    split: SglangSplit = static_split(spec, budget_bytes, ratio)
    if len(spec.mamba_groups) != 1:
        raise ValueError(f"{spec.name!r}: the static split models exactly one Mamba group")
    pages: dict[PageType, tuple[int, int]] = {
        PageType(PageKind.KV, spec.groups.index(g)): (split.kv_tokens, g.kv_bytes_per_token)
        for g in spec.attention_groups
    }
    (mamba,) = spec.mamba_groups
    pages[PageType(PageKind.STATE, spec.groups.index(mamba))] = (
        split.mamba_slots,
        split.state_bytes,
    )
    return StaticSplitMemory(budget_bytes, pages)
