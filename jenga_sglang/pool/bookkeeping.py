"""The pool's page states and the read-only view of its bookkeeping that checks and tests read.

A small page is EMPTY, EVICTABLE (cached, unreferenced) or USED; a large page is carved into one
type (its index k) or FREE. pool.py keeps every index in plain lists for speed; `Books` hands the
same objects to the integrity check (integrity.py) without exposing the pool's attributes.
"""

from __future__ import annotations

from typing import NamedTuple

EMPTY, EVICTABLE, USED = 0, 1, 2
FREE = -1  # type index of a large page that is not carved
STATE_NAMES = ("empty", "evictable", "used")


class Books(NamedTuple):
    """The pool's indices, by type index k and large page lp (views: do not mutate).

    per[k]            small pages of type k in one large page
    state[k][page]    EMPTY / EVICTABLE / USED of each small page of type k
    lp_type[lp]       the type a large page is carved as, or FREE
    lp_owner[lp]      the owner a carved large page is associated with
    lp_next[lp]       bump pointer: offsets >= it were never taken since carving
    lp_stack[lp]      small-page ids given back since carving
    lp_count[lp]      [empty, evictable, used] small pages in a large page
    free_large        free large pages (a stack)
    owner_open        (owner, k) -> that owner's large pages of type k with an empty page
    type_open[k]      large pages of type k with an empty page
    carved[k]         large pages carved as k
    reclaimable[k]    carved as k, holding evictable pages and no used page
    type_counts[k]    [empty, evictable, used] small pages of type k in carved large pages
    """

    per: list[int]
    state: list[bytearray]
    lp_type: list[int]
    lp_owner: list[int | None]
    lp_next: list[int]
    lp_stack: list[list[int]]
    lp_count: list[list[int]]
    free_large: list[int]
    owner_open: dict[tuple[int, int], dict[int, None]]
    type_open: list[dict[int, None]]
    carved: list[int]
    reclaimable: list[int]
    type_counts: list[list[int]]
