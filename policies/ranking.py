"""Ordered sets of nodes keyed by a sortable value.

`Ranked` keeps the whole order (min, max, ascending walks): the FLOP-aware policy needs them.
While it is small it is a plain sorted list (C bisect and a short memmove per update, several
times cheaper than SortedList's pure-Python bookkeeping): a byte budget's candidates number in
the hundreds. Past `Ranked.LARGE` entries it becomes a SortedList, whose updates stay O(log n).
`FirstRanked` answers only "which node comes first" from a binary heap (C `heapq`), which is
several times cheaper per update than a sorted list: LRU orders are updated on every insert,
eviction and hit but only ever asked for their first node.

Both order by (value, node id): the id breaks ties deterministically, so the two give the same
first node for the same updates.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator, Mapping
from heapq import heapify, heappop, heappush

from sortedcontainers import SortedList

from jenga_sglang.radix.node import Node


class Ranked:
    """Nodes ordered by (value, node id); the id breaks ties deterministically."""

    LARGE = 4096  # entries beyond which the order moves to a SortedList (for good)

    def __init__(self) -> None:
        self._order: list[tuple[float, int]] | SortedList = []
        self._keys: dict[int, tuple[float, int]] = {}
        self._nodes: dict[int, Node] = {}

    def put(self, node: Node, value: float) -> None:
        old = self._keys.get(node.id)
        key = (value, node.id)
        if old == key:
            return
        order = self._order
        if isinstance(order, list):  # (inline: puts and discards run on every lock and unlock)
            if old is not None:
                del order[bisect_left(order, old)]
            insort(order, key)
            if len(order) > self.LARGE:
                self._order = SortedList(order)
        else:
            if old is not None:
                order.remove(old)
            order.add(key)
        self._keys[node.id] = key
        self._nodes[node.id] = node

    def reset(self, entries: list[tuple[Node, float]]) -> None:
        """Replace every entry at once (O(n log n), cheaper than n puts)."""
        self._keys = {node.id: (value, node.id) for node, value in entries}
        self._nodes = {node.id: node for node, _ in entries}
        order = sorted(self._keys.values())
        self._order = order if len(order) <= self.LARGE else SortedList(order)

    def discard(self, node: Node) -> None:
        old = self._keys.pop(node.id, None)
        if old is not None:
            order = self._order
            if isinstance(order, list):
                del order[bisect_left(order, old)]
            else:
                order.remove(old)
            del self._nodes[node.id]

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, node: Node) -> bool:
        return node.id in self._keys

    def value(self, node: Node) -> float:
        return self._keys[node.id][0]

    def first(self) -> Node | None:
        return self._nodes[self._order[0][1]] if self._order else None

    def min_value(self) -> float:
        return float(self._order[0][0])

    def max_value(self) -> float:
        return float(self._order[-1][0])

    def ascending(self) -> Iterator[tuple[float, Node]]:
        for value, node_id in self._order:
            yield value, self._nodes[node_id]

    def keys(self) -> Iterator[tuple[float, int]]:
        """(value, node id) in ascending order, without node look-ups (hot loops)."""
        return iter(self._order)

    def entries(self) -> Mapping[int, tuple[float, int]]:
        """Node id -> (value, node id) of every node in the order: a read-only view for hot
        loops, which index it instead of calling a method per node."""
        return self._keys

    def node(self, node_id: int) -> Node:
        return self._nodes[node_id]


class FirstRanked:
    """Nodes ordered by (value, node id), asked only for the first one.

    A heap with lazy deletion: `put` pushes the node's new key and `discard` forgets the node;
    keys that no longer match a node's current one stay in the heap until they reach its top.
    When stale keys outnumber live ones the heap is rebuilt, so it stays within a constant
    factor of the live size.
    """

    _SLACK = 64  # stale keys tolerated on top of the live count before a rebuild

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._keys: dict[int, tuple[float, int]] = {}
        self._nodes: dict[int, Node] = {}

    def put(self, node: Node, value: float) -> None:
        key = (value, node.id)
        if self._keys.get(node.id) == key:
            return
        self._keys[node.id] = key
        self._nodes[node.id] = node
        heappush(self._heap, key)
        if len(self._heap) > 2 * len(self._keys) + self._SLACK:
            self._heap = list(self._keys.values())
            heapify(self._heap)

    def discard(self, node: Node) -> None:
        if self._keys.pop(node.id, None) is not None:
            del self._nodes[node.id]

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, node: Node) -> bool:
        return node.id in self._keys

    def first(self) -> Node | None:
        heap, keys = self._heap, self._keys
        while heap:
            top = heap[0]
            if keys.get(top[1]) == top:
                return self._nodes[top[1]]
            heappop(heap)
        return None
