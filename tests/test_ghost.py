"""GhostIndex: branch points in remembered token sequences, bounded by a token budget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jenga_sglang.policies.ghost import GhostIndex
from jenga_sglang.radix.tokens import TokenSeq


def t(*ids: int) -> TokenSeq:
    return TokenSeq.of(list(ids))


def r(start: int, n: int) -> TokenSeq:
    return TokenSeq.of(list(range(start, start + n)))


def test_branch_in_the_middle_of_a_remembered_sequence_reports_its_tail() -> None:
    ghost = GhostIndex(1000)
    ghost.remember(r(0, 100))
    b = ghost.branch(r(0, 40).concat(t(999)))
    assert (b.length, b.at_node_end, b.checkpointed, b.tail) == (40, False, False, 60)
    assert ghost.branch(t(7, 8)).length == 0  # nothing shared
    whole = ghost.branch(r(0, 100).concat(t(5)))  # continues at the end: a leaf end
    assert (whole.length, whole.at_node_end, whole.fanout, whole.tail) == (100, True, 0, 0)


def test_a_junction_of_remembered_sequences_is_a_node_end_with_fanout() -> None:
    ghost = GhostIndex(1000)
    ghost.remember(r(0, 50).concat(r(500, 20)))
    ghost.remember(r(0, 50).concat(r(700, 20)))
    b = ghost.branch(r(0, 50).concat(t(999)))
    assert (b.length, b.at_node_end, b.fanout, b.tail) == (50, True, 2, 0)
    # above the junction the edge forks below: no single sequence to measure a tail on
    assert ghost.branch(r(0, 30).concat(t(999))).tail == 0
    ghost.check_integrity()


def test_least_recently_remembered_sequences_are_forgotten_first() -> None:
    ghost = GhostIndex(250)
    a, b, c = r(0, 100), r(1000, 100), r(2000, 100)
    ghost.remember(a)
    ghost.remember(b)
    ghost.remember(a)  # a is used again: b is now the least recent
    ghost.remember(c)
    assert len(ghost) == 200
    assert ghost.branch(b).length == 0
    assert ghost.branch(a).length == 100 and ghost.branch(c).length == 100
    ghost.check_integrity()


def test_forgetting_a_leaf_keeps_the_shared_prefix_of_the_others() -> None:
    ghost = GhostIndex(130)
    ghost.remember(r(0, 50).concat(r(500, 40)))  # 90 tokens
    ghost.remember(r(0, 50).concat(r(700, 40)))  # +40 = 130
    ghost.remember(r(3000, 30))  # 160 > 130: the least recent leaf (the 500s) goes
    assert len(ghost) == 120
    assert ghost.branch(r(0, 50).concat(r(500, 40))).length == 50
    assert ghost.branch(r(0, 50).concat(r(700, 40))).length == 90
    ghost.check_integrity()


def test_a_sequence_longer_than_the_capacity_is_remembered_up_to_it() -> None:
    ghost = GhostIndex(64)
    ghost.remember(r(0, 100))
    assert len(ghost) == 64
    assert ghost.branch(r(0, 100)).length == 64
    ghost.check_integrity()


def test_bad_capacity() -> None:
    with pytest.raises(ValueError, match="capacity"):
        GhostIndex(0)


seqs = st.lists(st.integers(0, 3), min_size=1, max_size=24).map(TokenSeq.of)


def _lcp(a: TokenSeq, b: TokenSeq) -> int:
    return a.common_prefix(b)


@settings(max_examples=200, deadline=None)
@given(st.lists(seqs, min_size=1, max_size=12), seqs)
def test_branch_length_is_the_longest_shared_prefix(remembered: list[TokenSeq], q: TokenSeq):
    ghost = GhostIndex(10**6)  # nothing is forgotten
    for s in remembered:
        ghost.remember(s)
        ghost.check_integrity()
    b = ghost.branch(q)
    assert b.length == max(_lcp(s, q) for s in remembered)
    past = [s for s in remembered if _lcp(s, q) == b.length and len(s) > b.length]
    if b.tail:
        assert not b.at_node_end
        assert b.length + b.tail in {len(s) for s in past}
    if len({s.packed for s in past}) == 1 and not b.at_node_end:
        # one sequence continues past the branch point: the tail runs to its end unless
        # a shorter remembered sequence ends below (a boundary keeps them apart)
        (s,) = {s.packed: s for s in past}.values()
        below = [p for p in remembered if len(p) > b.length and _lcp(p, s) == len(p)]
        if len(below) == 1:
            assert b.tail == len(s) - b.length


@settings(max_examples=200, deadline=None)
@given(st.lists(seqs, min_size=1, max_size=30), st.integers(1, 40))
def test_capacity_holds_and_the_latest_sequence_is_whole(remembered: list[TokenSeq], cap: int):
    ghost = GhostIndex(cap)
    for s in remembered:
        ghost.remember(s)
        ghost.check_integrity()
        assert len(ghost) <= cap
        assert ghost.branch(s).length == min(len(s), cap)
