"""Typed results of tree look-ups, never changed once built.

Plain classes with slots: every request builds a few of them. They cost less than named tuples
in pure Python, and compiled (scripts/build_compiled.py) they are native classes, where a named
tuple's constructor stays a Python-level call.
"""

from __future__ import annotations

from jenga_sglang.radix.contracts import Branch
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import Pages


class Walk:
    """Raw token walk: `length` leading tokens are in the tree along `path` (root excluded).

    The last node of `path` may be matched only partly (length < its end).
    """

    __slots__ = ("length", "path")

    def __init__(self, length: int, path: tuple[Node, ...]) -> None:
        self.length = length
        self.path = path

    def __repr__(self) -> str:
        return f"Walk(length={self.length}, path={list(self.path)})"

    def prefix(self, n: int) -> Walk:
        """The walk of the key's first `n` tokens (the same nodes, cut at n): one walk of
        input + output answers both the input's match and the insert of a prefix of both."""
        if n >= self.length:
            return self
        return Walk(n, tuple(node for node in self.path if node.start < n))

    def checkpoints(self) -> set[int]:
        """Positions up to `length` where the path holds an SSM checkpoint (the last node may
        end past `length`, on another sequence: its state is not one of them)."""
        return {n.end for n in self.path if n.state is not None and n.end <= self.length}

    def branch(self) -> Branch:
        if not self.path:
            return Branch(length=0, at_node_end=True, checkpointed=True)
        last = self.path[-1]
        at_end = last.end == self.length
        fanout = len(last.children) if at_end else 1
        tail = 0 if at_end else _tail(last, self.length)
        return Branch(self.length, at_end, at_end and last.state is not None, fanout, tail)


def deepest_whole(path: tuple[Node, ...], length: int) -> Node | None:
    """The deepest node of `path` that its first `length` tokens cover whole (the last node of
    a walk or a hit may end past `length`, on another sequence)."""
    for node in reversed(path):
        if node.end <= length:
            return node
    return None


def _tail(node: Node, at: int) -> int:
    """Tokens from `at` (inside `node`'s edge) to the end of the one cached sequence through
    `node`: follow only children down to a leaf. 0 when the path forks below (no single
    sequence to measure)."""
    while len(node.children) == 1:
        (node,) = node.children.values()
    return node.end - at if not node.children else 0


class MatchResult:
    """The longest prefix every layer group can reuse.

        tokens:  [0 ............ length) [length ...... walk.length) [....... len(input))
                  reusable by all groups   in the tree, not valid      not in the tree

    `path` holds the nodes covering [0, length); the last one may extend beyond `length` when
    no Mamba group forces hits onto node ends.
    """

    __slots__ = ("length", "path", "walk")

    def __init__(self, length: int, path: tuple[Node, ...], walk: Walk) -> None:
        self.length = length
        self.path = path
        self.walk = walk

    def __repr__(self) -> str:
        return f"MatchResult(length={self.length}, path={list(self.path)}, walk={self.walk})"

    @property
    def node(self) -> Node | None:
        """Deepest node covering the hit (None for an empty hit)."""
        return self.path[-1] if self.path else None

    @property
    def state(self) -> Pages | None:
        """The SSM checkpoint valid at `length`, if the deepest node ends exactly there."""
        node = self.node
        return node.state if node is not None and node.end == self.length else None

    def kv_pages(self, slot: int) -> list[Pages]:
        """Pages of attention group `slot` along the hit, node by node (tombstones excluded)."""
        out: list[Pages] = []
        for node in self.path:
            pages = node.kv[slot]
            keep = min(node.end, self.length) - node.start - node.tombstones[slot]
            if keep > 0:
                out.append(pages.split(keep)[0] if keep < len(pages) else pages)
        return out
