"""PairedJengaPool: full and window KV of a sliding-window model from one Jenga pool.

Geometry: full KV pages of 256 bytes (3 per large page), window pages of 384 bytes (2 per
large page). What either allocator reports to SGLang is the pairs that fit, never a count of
free large pages both halves could claim.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from jenga_sglang.pool.paired import PairedJengaPool
from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.pool.sizing import compute_geometry
from jenga_sglang.radix.pages import PageKind, PageType

FULL = PageType(PageKind.KV, 0)
WINDOW = PageType(PageKind.KV, 1)
LARGE = 768


def _paired(large_pages: int) -> PairedJengaPool:
    return PairedJengaPool(
        JengaPool(compute_geometry({FULL: 256, WINDOW: 384}), large_pages * LARGE), FULL, WINDOW
    )


def test_an_empty_pool_reports_the_pairs_not_either_half() -> None:
    paired = _paired(10)
    assert paired.room(FULL) == 30 and paired.room(WINDOW) == 20  # each alone
    # n pairs: ceil(n / 3) + ceil(n / 2) large pages <= 10  ->  n = 12 (4 + 6)
    assert paired.pairs() == paired.available(FULL) == paired.available(WINDOW) == 12


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_pairs_is_exactly_what_fits(seed: int) -> None:
    """After random allocations and frees, `pairs()` pairs can be allocated (full, then
    window) and one more cannot."""
    rng = random.Random(seed)
    paired = _paired(12)
    held: dict[PageType, list[int]] = {FULL: [], WINDOW: []}
    for _ in range(rng.randrange(40)):
        ptype = rng.choice((FULL, WINDOW))
        if held[ptype] and rng.random() < 0.4:
            gone = [held[ptype].pop(rng.randrange(len(held[ptype])))]
            paired.free(ptype, gone)
        else:
            ids = paired.alloc(ptype, 1)
            if ids:
                held[ptype] += ids
    n = paired.pairs()
    full = paired.alloc(FULL, n)
    assert full is not None and paired.alloc(WINDOW, n) is not None
    one_more = paired.alloc(FULL, 1)
    assert one_more is None or paired.alloc(WINDOW, 1) is None
    paired.check_integrity()


def test_most_full_leaves_room_for_the_window_pages_asked() -> None:
    paired = _paired(10)
    assert paired.most_full(0) == 30
    assert paired.most_full(3) == 24  # 2 large pages of window pages: 8 left for full
    assert paired.alloc(FULL, paired.most_full(3)) is not None
    assert paired.alloc(WINDOW, 3) is not None
