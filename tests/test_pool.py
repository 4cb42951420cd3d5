"""JengaPool bookkeeping: Jenga Figures 6 and 8, the five-step order, atomicity, bad ids."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.pool.sizing import compute_geometry
from jenga_sglang.radix.memory import Evictor
from jenga_sglang.radix.pages import IdPages, OutOfMemory, PageKind, PageType

IMG = PageType(PageKind.KV, 0)
TXT = PageType(PageKind.KV, 1)
A = PageType(PageKind.KV, 0)  # 4 pages per large page
B = PageType(PageKind.STATE, 1)  # 1 page per large page


class CacheOwner(Evictor):
    """A tiny stand-in for the tree: holds cached entries and evicts them on demand, FIFO."""

    def __init__(self, pool: JengaPool, *, refuse: bool = False) -> None:
        self.pool = pool
        self.refuse = refuse
        self.entries: list[tuple[PageType, list[int]]] = []
        self.calls: list[PageType] = []
        pool.set_evictor(self)

    def cache(self, ptype: PageType, ids: list[int]) -> None:
        self.pool.mark_evictable(ptype, IdPages(ids))
        self.entries.append((ptype, ids))

    def evict_for(self, ptype: PageType) -> bool:
        self.calls.append(ptype)
        if self.refuse or not self.entries:
            return False
        etype, ids = self.entries.pop(0)
        self.pool.free_evictable(etype, IdPages(ids))
        return True


def _fig8_pool(large_pages: int, *, request_aware: bool = True) -> JengaPool:
    geo = compute_geometry({A: 64, B: 256})
    return JengaPool(geo, large_pages * 256, request_aware=request_aware)


def _lp(pool: JengaPool, ptype: PageType, page: int) -> int:
    return page // pool.geometry.of(ptype).per_large


def test_figure6_two_level_allocation() -> None:
    pool = JengaPool(compute_geometry({IMG: 256, TXT: 384}), 3 * 768)
    img = pool.alloc(IMG, 4, owner=7).ids()
    txt = pool.alloc(TXT, 2, owner=7).ids()
    img_large = {_lp(pool, IMG, p) for p in img}
    txt_large = {_lp(pool, TXT, p) for p in txt}
    assert len(img_large) == 2 and len(txt_large) == 1 and not img_large & txt_large
    # byte ranges of the two types never overlap: page i of type t sits at i * s_t
    img_bytes = {b for p in img for b in range(p * 256, (p + 1) * 256)}
    txt_bytes = {b for p in txt for b in range(p * 384, (p + 1) * 384)}
    assert not img_bytes & txt_bytes
    assert pool.held_bytes() == 4 * 256 + 2 * 384
    assert pool.fragmentation_bytes() == 2 * 256  # two empty image slots
    assert pool.free_large_pages == 0
    pool.check_integrity()


def test_figure8_request_aware_keeps_requests_apart() -> None:
    pool = _fig8_pool(4)
    pages: dict[int, list[int]] = {1: [], 2: []}
    for _ in range(8):
        for owner in (1, 2):
            pages[owner] += pool.alloc(A, 1, owner).ids()
    for owner in (1, 2):
        assert {pool.owner_of(A, p) for p in pages[owner]} == {owner}
    assert not {_lp(pool, A, p) for p in pages[1]} & {_lp(pool, A, p) for p in pages[2]}
    pool.free(A, IdPages(pages[1]))
    assert pool.free_large_pages == 2  # request 1's two large pages came back whole
    assert pool.fragmentation_bytes() == 0
    pool.check_integrity()


def test_figure8_naive_allocation_fragments() -> None:
    pool = _fig8_pool(4, request_aware=False)
    pages: dict[int, list[int]] = {1: [], 2: []}
    for _ in range(8):
        for owner in (1, 2):
            pages[owner] += pool.alloc(A, 1, owner).ids()
    pool.free(A, IdPages(pages[1]))
    assert pool.free_large_pages == 0  # every large page still holds request 2's pages
    assert pool.fragmentation_bytes() == 8 * 64
    pool.check_integrity()


def test_large_page_returns_and_serves_another_type() -> None:
    pool = _fig8_pool(1)
    a = pool.alloc(A, 3, owner=1)
    with pytest.raises(OutOfMemory):
        pool.alloc(B, 1, owner=1)
    pool.free(A, a)
    assert pool.alloc(B, 1, owner=2).ids() == [0]
    pool.check_integrity()


# ---- the five-step order, each step in isolation ----------------------------------------------


def test_step1_prefers_the_owners_open_large_page() -> None:
    pool = _fig8_pool(3)
    owner = CacheOwner(pool)
    first = pool.alloc(A, 1, owner=1).ids()[0]
    pool.alloc(A, 1, owner=2)
    again = pool.alloc(A, 1, owner=1).ids()[0]
    assert _lp(pool, A, again) == _lp(pool, A, first)
    assert pool.free_large_pages == 1 and owner.calls == []


def test_step2_carves_a_free_large_page_for_the_owner() -> None:
    pool = _fig8_pool(2)
    owner = CacheOwner(pool)
    pool.alloc(A, 1, owner=1)  # large page 0, three empty slots left for owner 1
    page = pool.alloc(A, 1, owner=2).ids()[0]
    assert pool.owner_of(A, page) == 2 and _lp(pool, A, page) == 1
    assert owner.calls == []


def test_step3_evicts_a_whole_large_page_before_using_others_slots() -> None:
    pool = _fig8_pool(2)
    owner = CacheOwner(pool)
    pool.alloc(A, 1, owner=1)  # large page 0: owner 1, three empty slots (a step-4 candidate)
    cached = pool.alloc(B, 1, owner=3).ids()  # large page 1: only evictable after caching
    owner.cache(B, cached)
    page = pool.alloc(A, 1, owner=2).ids()[0]
    assert owner.calls == [A]
    assert _lp(pool, A, page) == 1 and pool.owner_of(A, page) == 2
    assert pool.usage(A).free == 3 + 3  # owner 1's slots untouched, three left in page 1
    pool.check_integrity()


def test_step3_gives_up_when_the_evictor_runs_dry_then_step4() -> None:
    pool = _fig8_pool(2)
    owner = CacheOwner(pool, refuse=True)
    first = pool.alloc(A, 1, owner=1).ids()[0]
    owner.cache(B, pool.alloc(B, 1, owner=3).ids())
    page = pool.alloc(A, 1, owner=2).ids()[0]
    assert owner.calls == [A]  # asked once, refused
    assert _lp(pool, A, page) == _lp(pool, A, first) and pool.owner_of(A, page) == 1


def test_step4_takes_another_owners_slot_without_evicting() -> None:
    pool = _fig8_pool(2)
    owner = CacheOwner(pool)
    first = pool.alloc(A, 1, owner=1).ids()[0]
    pool.alloc(B, 1, owner=3)  # used: large page 1 is not reclaimable
    page = pool.alloc(A, 1, owner=2).ids()[0]
    assert owner.calls == []
    assert _lp(pool, A, page) == _lp(pool, A, first)


def test_step5_evicts_small_pages_of_the_type() -> None:
    pool = _fig8_pool(2)
    owner = CacheOwner(pool)
    ids = pool.alloc(A, 4, owner=1).ids()  # large page 0 full
    owner.cache(A, ids[:1])  # one evictable page among used ones: not reclaimable
    pool.alloc(B, 1, owner=3)  # large page 1 used
    page = pool.alloc(A, 1, owner=2).ids()[0]
    assert owner.calls == [A]
    assert page == ids[0] and pool.owner_of(A, page) == 1
    pool.check_integrity()


def test_out_of_memory_when_nothing_can_be_evicted() -> None:
    pool = _fig8_pool(1)
    CacheOwner(pool)
    pool.alloc(B, 1, owner=1)
    before = pool.snapshot()
    with pytest.raises(OutOfMemory, match="at most 0"):
        pool.alloc(A, 1, owner=2)
    assert pool.snapshot() == before


# ---- atomicity -------------------------------------------------------------------------------


def test_larger_than_the_whole_pool_raises_before_evicting() -> None:
    pool = _fig8_pool(2)
    owner = CacheOwner(pool)
    owner.cache(A, pool.alloc(A, 2, owner=1).ids())
    before = pool.snapshot()
    with pytest.raises(OutOfMemory, match=r"9 kv\[0\] pages \(576 bytes\) exceeds the whole pool"):
        pool.alloc(A, 9, owner=2)
    assert owner.calls == [] and pool.snapshot() == before


def test_precheck_counts_what_eviction_could_free() -> None:
    pool = _fig8_pool(3)
    owner = CacheOwner(pool)
    pool.alloc(B, 1, owner=1)  # used
    owner.cache(A, pool.alloc(A, 2, owner=2).ids())
    pool.alloc(A, 1, owner=2)  # large page 1: 2 evictable + 1 used + 1 empty
    before = pool.snapshot()
    with pytest.raises(OutOfMemory, match="at most 7"):
        pool.alloc(A, 8, owner=3)  # 4 (free large page) + 3 (all but the used one)
    assert owner.calls == [] and pool.snapshot() == before
    assert len(pool.alloc(A, 7, owner=3)) == 7
    pool.check_integrity()


def test_failed_allocation_rolls_back() -> None:
    pool = _fig8_pool(3)
    owner = CacheOwner(pool, refuse=True)
    owner.cache(B, pool.alloc(B, 1, owner=1).ids())
    pool.alloc(A, 1, owner=2)  # 3 empty A slots + 1 free large page + 1 evictable large page
    before = pool.snapshot()
    usage = pool.usage(A)
    with pytest.raises(OutOfMemory, match="evictor ran dry"):
        pool.alloc(A, 9, owner=3)  # precheck passes (9 <= 11); the evictor refuses
    assert owner.calls and pool.snapshot() == before and pool.usage(A) == usage
    pool.check_integrity()


# ---- bad ids -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "ptype", "ids", "message"),
    [
        ("free", A, [99], "out of range"),
        ("free", A, [-1], "out of range"),
        ("free", A, [8], "free large page"),
        ("free", A, [4], r"carved as state\[1\]"),  # large page 1 holds the B page
        ("free", A, [1], "is evictable, expected used"),
        ("free", A, [0, 0], "duplicate"),
        ("free_evictable", A, [0], "is used, expected evictable"),
        ("free_evictable", A, [2], "is empty, expected evictable"),
        ("mark_used", A, [0], "is used, expected evictable"),
        ("mark_evictable", A, [1], "is evictable, expected used"),
        ("mark_evictable", B, [0], "carved as kv"),
        ("free", PageType(PageKind.KV, 5), [0], "unknown page type"),
    ],
)
def test_bad_ids_are_rejected_without_change(
    op: str, ptype: PageType, ids: list[int], message: str
) -> None:
    pool = _fig8_pool(3)
    pool.alloc(A, 2, owner=1)  # pages 0, 1 in large page 0
    pool.mark_evictable(A, IdPages([1]))
    pool.alloc(B, 1, owner=1)  # B page 1 = large page 1
    before = pool.snapshot()
    with pytest.raises(ValueError, match=message):
        getattr(pool, op)(ptype, IdPages(ids))
    assert pool.snapshot() == before
    pool.check_integrity()


def test_partially_bad_batch_changes_nothing() -> None:
    pool = _fig8_pool(2)
    ids = pool.alloc(A, 3, owner=1).ids()
    before = pool.snapshot()
    with pytest.raises(ValueError, match="out of range"):
        pool.free(A, IdPages([ids[0], ids[1], 1000]))
    assert pool.snapshot() == before


def test_capacity_smaller_than_a_large_page() -> None:
    with pytest.raises(ValueError, match="smaller than one large page"):
        JengaPool(compute_geometry({A: 64, B: 256}), 255)


# ---- property: random operations keep every invariant ------------------------------------------

TYPES = (PageType(PageKind.KV, 0), PageType(PageKind.KV, 1), PageType(PageKind.STATE, 2))
KINDS = ("alloc", "alloc", "free", "cache", "uncache", "evict")
# One integer per operation (cheaper for hypothesis to draw than a tuple of five strategies);
# _decode splits it into kind, type, count, owner and a selector of a live entry.
OPS = st.integers(0, len(KINDS) * len(TYPES) * 6 * 4 * 1024 - 1)


def _decode(code: int) -> tuple[str, PageType, int, int, int]:
    code, kind = divmod(code, len(KINDS))
    code, ptype = divmod(code, len(TYPES))
    code, count = divmod(code, 6)
    pick, owner = divmod(code, 4)
    return KINDS[kind], TYPES[ptype], count + 1, owner, pick


def _used(pool: JengaPool) -> dict[PageType, int]:
    return {t: pool.usage(t).used for t in TYPES}


def _apply(
    pool: JengaPool,
    tree: CacheOwner,
    live: list[tuple[PageType, list[int]]],
    op: tuple[str, PageType, int, int, int],
) -> None:
    kind, ptype, count, owner, pick = op
    if kind == "alloc":
        used = _used(pool)
        try:
            live.append((ptype, pool.alloc(ptype, count, owner).ids()))
        except OutOfMemory:
            assert _used(pool) == used  # nothing leaked; only evictions happened
    elif kind == "free" and live:
        t, ids = live.pop(pick % len(live))
        pool.free(t, IdPages(ids))
    elif kind == "cache" and live:
        t, ids = live.pop(pick % len(live))
        tree.cache(t, ids)
    elif kind == "uncache" and tree.entries:
        t, ids = tree.entries.pop(pick % len(tree.entries))
        pool.mark_used(t, IdPages(ids))
        live.append((t, ids))
    elif kind == "evict":
        tree.evict_for(ptype)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(OPS, min_size=200, max_size=200), request_aware=st.booleans())
def test_random_operations_keep_invariants(ops: list[int], request_aware: bool) -> None:
    geo = compute_geometry(dict(zip(TYPES, (64, 96, 192), strict=True)))
    pool = JengaPool(geo, 6 * 192 + 50, request_aware=request_aware)
    tree = CacheOwner(pool)
    live: list[tuple[PageType, list[int]]] = []
    for code in ops:
        _apply(pool, tree, live, _decode(code))
        pool.check_integrity()
        for t in TYPES:
            usage = pool.usage(t)
            assert usage.used == sum(len(ids) for u, ids in live if u == t)
            assert usage.evictable == sum(len(ids) for u, ids in tree.entries if u == t)
            assert usage.free + usage.used + usage.evictable == usage.total
        held = {p for t, ids in live + tree.entries for p in ((t, i) for i in ids)}
        assert len(held) == sum(len(ids) for _, ids in live + tree.entries)  # no id twice


# ---- the fragmentation benchmark, on a small workload ------------------------------------------


def test_fragmentation_benchmark_timeline_metrics_are_consistent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from jenga_sglang.bench.studies.fragmentation import main

    argv = ["--requests", "6", "--min-tokens", "3000", "--max-tokens", "9000"]
    argv += ["--decode-tokens", "200", "--chunk-tokens", "1024", "--jobs", "1", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {(r["capacity"], r["allocator"]): r for r in report["results"]}
    assert len(rows) == 6
    for r in rows.values():
        assert r["finished"] == 6 and r["admissions"] == 6 + r["preemptions"]
        assert r["held"]["max_bytes"] <= r["capacity_bytes"]
        assert r["capacity_bytes"] % report["large_page_bytes"] == r["remainder_bytes"]
        # The remainder is always unusable; the allocator's share is bounded by the reserved
        # but empty bytes, sample by sample, hence in average and maximum too.
        assert r["unusable"]["avg_bytes"] == pytest.approx(
            r["remainder_bytes"] + r["allocator_unusable"]["avg_bytes"]
        )
        for key in ("avg_bytes", "max_bytes"):
            assert r["allocator_unusable"][key] <= r["reserved_empty"][key]
        for f in r["failures"].values():
            assert 0 <= f["fragmentation_caused"] <= f["count"]
            assert f["unusable"]["max_bytes"] >= r["remainder_bytes"]
    for allocator in ("request-aware", "naive"):
        # The 60% pool cannot hold all six requests at once, the 150% pool can.
        tight, roomy = rows[("60%", allocator)], rows[("150%", allocator)]
        assert tight["avg_decode_batch"] < roomy["avg_decode_batch"] == pytest.approx(6, abs=0.5)


def test_padding_is_counted_as_waste_not_as_held() -> None:
    small, big = PageType(PageKind.KV, 0), PageType(PageKind.STATE, 1)
    geo = compute_geometry({small: 2000, big: 209_458}, alignment=16, max_ratio=8)
    assert geo.granule > 1  # the exact LCM is too large: sizes were padded
    pool = JengaPool(geo, 3 * geo.large_page_bytes + 100)
    pool.alloc(small, 5, owner=1)
    pool.alloc(big, 1, owner=2)
    s, b = geo.of(small), geo.of(big)
    assert pool.held_bytes() == 5 * 2000 + 209_458
    assert pool.padding_bytes() == 5 * s.padding_bytes + b.padding_bytes
    assert pool.fragmentation_bytes() == (s.per_large - 5) * s.page_bytes
    assert pool.wasted_bytes() == pool.padding_bytes() + pool.fragmentation_bytes() + 100
    pool.check_integrity()
