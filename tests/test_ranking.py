"""The candidate orders against a brute-force reference, under random updates."""

from __future__ import annotations

import random

import pytest

from jenga_sglang.policies.ranking import FirstRanked, Ranked
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.tokens import TokenSeq


def _nodes(n: int) -> list[Node]:
    return [Node(i, TokenSeq.of([i]), None, [], [], now=0) for i in range(1, n + 1)]


def _random_ops(seed: int, nodes: list[Node], steps: int) -> list[tuple[str, Node, int]]:
    rng = random.Random(seed)
    # few distinct values, so ties (broken by node id) are common
    return [
        (rng.choice(("put", "put", "discard")), rng.choice(nodes), rng.randrange(8))
        for _ in range(steps)
    ]


@pytest.mark.parametrize("large", [4, 10_000])  # a SortedList after a few entries, or never
def test_ranked_matches_a_sorted_reference(large: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Ranked, "LARGE", large)
    nodes = _nodes(20)
    ranked, ref = Ranked(), {}
    for step, (op, node, value) in enumerate(_random_ops(1, nodes, 3000)):
        if op == "put":
            ranked.put(node, value)
            ref[node.id] = (value, node.id)
        else:
            ranked.discard(node)
            ref.pop(node.id, None)
        if step % 50 == 0:  # a rebase replaces everything at once
            ranked.reset([(n, ref[n.id][0]) for n in nodes if n.id in ref])
        order = sorted(ref.values())
        assert list(ranked.keys()) == order
        assert len(ranked) == len(order)
        if order:
            assert ranked.first() is nodes[order[0][1] - 1]
            assert (ranked.min_value(), ranked.max_value()) == (order[0][0], order[-1][0])
        else:
            assert ranked.first() is None


def test_first_ranked_gives_the_first_node_of_a_sorted_reference() -> None:
    nodes = _nodes(20)
    first, ref = FirstRanked(), {}
    for op, node, value in _random_ops(2, nodes, 5000):
        if op == "put":
            first.put(node, value)
            ref[node.id] = (value, node.id)
        else:
            first.discard(node)
            ref.pop(node.id, None)
        expected = nodes[min(ref.values())[1] - 1] if ref else None
        assert first.first() is expected
        assert len(first) == len(ref)
        assert all((n in first) == (n.id in ref) for n in nodes)
