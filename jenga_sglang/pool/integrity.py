"""Full consistency check of a JengaPool, recomputed from the per-page states (O(pages)).

Kept apart from pool.py, which stays the hot path; it reads the pool's bookkeeping through
`JengaPool.books()` (bookkeeping.py). Tests call it after each step. Types are referred to by
their index k in `pool.page_types`, as inside the pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jenga_sglang.pool.bookkeeping import EMPTY, EVICTABLE, FREE, USED, Books

if TYPE_CHECKING:
    from jenga_sglang.pool.pool import JengaPool


def check_pool(pool: JengaPool) -> None:
    """Raise AssertionError when any invariant of the pool is broken (see the checks below)."""
    b = pool.books()
    free = b.free_large
    assert len(set(free)) == len(free), f"large page twice on the free list: {free}"
    ntypes = len(pool.page_types)
    totals = [[0, 0, 0] for _ in range(ntypes)]
    carved, reclaimable = [0] * ntypes, [0] * ntypes
    free_set = set(free)
    for lp in range(pool.num_large):
        k = b.lp_type[lp]
        _check_other_types_empty(b, lp, k)
        if k == FREE:
            assert lp in free_set, f"large page {lp} is neither carved nor free"
            assert b.lp_owner[lp] is None, f"free large page {lp} has an owner"
            assert b.lp_count[lp] == [0, 0, 0], f"free large page {lp}: {b.lp_count[lp]}"
            continue
        assert lp not in free_set, f"large page {lp} is carved as type {k} and on the free list"
        counts = _check_carved(b, lp, k)
        carved[k] += 1
        reclaimable[k] += counts[USED] == 0 and counts[EVICTABLE] > 0
        for s in range(3):
            totals[k][s] += counts[s]
    for k, t in enumerate(pool.page_types):
        assert totals[k] == b.type_counts[k], (
            f"{t}: counted {totals[k]}, tracked {b.type_counts[k]}"
        )
        assert sum(totals[k]) == carved[k] * b.per[k], f"{t}: states do not sum to carved"
        assert carved[k] == b.carved[k], f"{t}: {carved[k]} carved, tracked {b.carved[k]}"
        assert reclaimable[k] == b.reclaimable[k], f"{t}: reclaimable count drifted"
    _check_open_indices(b, pool.num_large)
    accounted = pool.held_bytes() + pool.wasted_bytes()
    accounted += len(free) * pool.geometry.large_page_bytes
    assert accounted == pool.capacity_bytes, f"bytes do not partition: {accounted}"


def _check_other_types_empty(b: Books, lp: int, carved_as: int) -> None:
    for u, per in enumerate(b.per):
        if u != carved_as:
            assert not any(b.state[u][lp * per : (lp + 1) * per]), (
                f"large page {lp} (carved as type {carved_as}) has non-empty type-{u} pages"
            )


def _check_carved(b: Books, lp: int, k: int) -> list[int]:
    per = b.per[k]
    assert b.lp_owner[lp] is not None, f"carved large page {lp} has no owner"
    states = b.state[k][lp * per : (lp + 1) * per]
    counts = [states.count(s) for s in (EMPTY, EVICTABLE, USED)]
    assert counts == b.lp_count[lp], f"large page {lp}: {counts} vs {b.lp_count[lp]}"
    assert counts[EMPTY] < per, f"large page {lp} is all empty but still carved"
    stack, nxt = b.lp_stack[lp], b.lp_next[lp]
    empties = set(stack) | set(range(lp * per + nxt, (lp + 1) * per))
    assert len(empties) == len(stack) + per - nxt, f"large page {lp}: free slots overlap"
    actual = {lp * per + i for i, s in enumerate(states) if s == EMPTY}
    assert empties == actual, f"large page {lp}: free slots {sorted(empties)} vs {sorted(actual)}"
    return counts


def _check_open_indices(b: Books, num_large: int) -> None:
    for k, open_pages in enumerate(b.type_open):
        expected = {
            lp for lp in range(num_large) if b.lp_type[lp] == k and b.lp_count[lp][EMPTY] > 0
        }
        assert set(open_pages) == expected, f"type {k}: open {sorted(open_pages)} vs {expected}"
    listed = 0
    for (owner, k), pages in b.owner_open.items():
        assert pages, f"empty owner index kept for owner {owner}, type {k}"
        for lp in pages:
            assert b.lp_owner[lp] == owner and b.lp_type[lp] == k, (
                f"large page {lp} listed for owner {owner} as type {k}"
            )
        listed += len(pages)
    assert listed == sum(len(p) for p in b.type_open), "owner index incomplete"
