"""Full consistency check of a JengaPool, recomputed from the per-page states (O(pages)).

Kept apart from pool.py because it reads every internal index; tests call it after each step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jenga_sglang.radix.memory import PageType

if TYPE_CHECKING:
    from jenga_sglang.pool.pool import JengaPool

EMPTY, EVICTABLE, USED = 0, 1, 2


def check_pool(pool: JengaPool) -> None:
    """Raise AssertionError when any invariant of the pool is broken (see the checks below)."""
    free = pool._free_large
    assert len(set(free)) == len(free), f"large page twice on the free list: {free}"
    totals = {t: [0, 0, 0] for t in pool.page_types}
    carved = dict.fromkeys(pool.page_types, 0)
    reclaimable = dict.fromkeys(pool.page_types, 0)
    free_set = set(free)
    for lp in range(pool.num_large):
        t = pool._lp_type[lp]
        _check_other_types_empty(pool, lp, t)
        if t is None:
            assert lp in free_set, f"large page {lp} is neither carved nor free"
            assert pool._lp_owner[lp] is None, f"free large page {lp} has an owner"
            assert pool._lp_count[lp] == [0, 0, 0], f"free large page {lp}: {pool._lp_count[lp]}"
            continue
        assert lp not in free_set, f"large page {lp} is carved as {t} and on the free list"
        counts = _check_carved(pool, lp, t)
        carved[t] += 1
        reclaimable[t] += counts[USED] == 0 and counts[EVICTABLE] > 0
        for s in range(3):
            totals[t][s] += counts[s]
    for t in pool.page_types:
        assert totals[t] == pool._count[t], f"{t}: counted {totals[t]}, tracked {pool._count[t]}"
        assert sum(totals[t]) == carved[t] * pool._per[t], f"{t}: states do not sum to carved"
        assert carved[t] == pool._carved[t], f"{t}: {carved[t]} carved, tracked {pool._carved[t]}"
        assert reclaimable[t] == pool._reclaimable[t], f"{t}: reclaimable count drifted"
    _check_open_indices(pool)
    accounted = pool.held_bytes() + pool.wasted_bytes()
    accounted += len(free) * pool.geometry.large_page_bytes
    assert accounted == pool.capacity_bytes, f"bytes do not partition: {accounted}"


def _check_other_types_empty(pool: JengaPool, lp: int, carved_as: PageType | None) -> None:
    for u in pool.page_types:
        if u == carved_as:
            continue
        per = pool._per[u]
        assert not any(pool._state[u][lp * per : (lp + 1) * per]), (
            f"large page {lp} (carved as {carved_as}) has non-empty {u} pages"
        )


def _check_carved(pool: JengaPool, lp: int, t: PageType) -> list[int]:
    per = pool._per[t]
    assert pool._lp_owner[lp] is not None, f"carved large page {lp} has no owner"
    states = pool._state[t][lp * per : (lp + 1) * per]
    counts = [states.count(s) for s in (EMPTY, EVICTABLE, USED)]
    assert counts == pool._lp_count[lp], f"large page {lp}: {counts} vs {pool._lp_count[lp]}"
    assert counts[EMPTY] < per, f"large page {lp} is all empty but still carved"
    stack, nxt = pool._lp_stack[lp], pool._lp_next[lp]
    empties = set(stack) | set(range(lp * per + nxt, (lp + 1) * per))
    assert len(empties) == len(stack) + per - nxt, f"large page {lp}: free slots overlap"
    actual = {lp * per + k for k, s in enumerate(states) if s == EMPTY}
    assert empties == actual, f"large page {lp}: free slots {sorted(empties)} vs {sorted(actual)}"
    return counts


def _check_open_indices(pool: JengaPool) -> None:
    for t, open_pages in pool._type_open.items():
        expected = {
            lp
            for lp in range(pool.num_large)
            if pool._lp_type[lp] == t and pool._lp_count[lp][EMPTY] > 0
        }
        assert set(open_pages) == expected, f"{t}: open index {sorted(open_pages)} vs {expected}"
    listed = 0
    for (owner, t), pages in pool._owner_open.items():
        assert pages, f"empty owner index kept for {owner}, {t}"
        for lp in pages:
            assert pool._lp_owner[lp] == owner and pool._lp_type[lp] == t, (
                f"large page {lp} listed for owner {owner} as {t}"
            )
        listed += len(pages)
    assert listed == sum(len(p) for p in pool._type_open.values()), "owner index incomplete"
