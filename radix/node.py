"""A node of the heterogeneous radix tree.

A node owns the edge from its parent to itself: the tokens `key`, covering absolute positions
[start, end) of every sequence through it, and for that span

* per attention group, the KV pages of the tokens (sliding-window groups may have dropped the
  leading `tombstones[g]` tokens' pages: those positions are out of every window that matters);
* optionally one SSM checkpoint, valid exactly at `end` (the state after tokens [0, end)).

    root ── [0, 5) ──┬── [5, 9)   state@9
                     └── [5, 12)  state@12

A node may also be a *run*: checkpoints strictly inside its edge (`inner`). It stands for the
chain of nodes that cutting it at each of them gives, all sharing its recency, locks and hit
count; the tree builds runs only for policies that rank such a chain as one node
(`EvictionPolicy.evicts_runs`) and cuts them wherever the chain's nodes could differ (tree.py,
"Runs"):

    [0, 96) inner@32,64 state@96   stands for   [0, 32)@ ── [32, 64)@ ── [64, 96)@

`lock_ref` counts the locks held on this node or below it (locking a node increments it along the
whole path to the root), so a node with lock_ref > 0 and all its ancestors are never evicted.

With a host tier (radix/host.py, docs/host-tier.md) a node's KV may live in host memory
(`host`); such nodes hang in their parent's `host_children`, never in `children`, so the device
part of the tree, all the eviction policies see, is closed upwards. A checkpoint is in `state`
(device) or `host_state` (host), never both. A device node loaded back from host may keep the
host pages it came from (`host_copy`, radix/host_copy.py), so demoting it again writes nothing.
Without a tier these stay False, empty and None.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from mypy_extensions import mypyc_attr

from jenga_sglang.radix.pages import Pages
from jenga_sglang.radix.tokens import TokenSeq


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class CleanCopy:
    """Host pages still holding a device node's bytes since its load-back (radix/host_copy.py):
    per attention group the pages of the positions just before `kv_end` (the node's end when
    kept; an empty list: no KV copy), and the checkpoint at the node's end, whose device
    checkpoint it copies (T6)."""

    __slots__ = ("kv", "kv_end", "state")

    def __init__(self, kv: list[Pages], kv_end: int, state: Pages | None) -> None:
        self.kv = kv
        self.kv_end = kv_end
        self.state = state


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class Node:
    __slots__ = (
        "children",
        "end",
        "hit_count",
        "host",
        "host_children",
        "host_copy",
        "host_state",
        "id",
        "inner",
        "key",
        "kv",
        "last_access",
        "lock_ref",
        "parent",
        "start",
        "state",
        "tombstones",
    )

    def __init__(
        self,
        node_id: int,
        key: TokenSeq,
        parent: Node | None,
        kv: list[Pages],
        tombstones: Sequence[int],
        now: int,
    ) -> None:
        self.id = node_id
        self.key = key
        self.parent = parent
        self.children: dict[bytes, Node] = {}
        self.kv = kv
        # A tuple of ints: the garbage collector stops tracking it, one object fewer per node
        # for every full collection to walk (bench/RESULTS.md, "Scheduler cost").
        self.tombstones: tuple[int, ...] = tuple(tombstones)
        self.state: Pages | None = None
        # (absolute position, one-page state) strictly inside (start, end), ascending: a run
        self.inner: tuple[tuple[int, Pages], ...] = ()
        self.lock_ref = 0
        self.last_access = now
        self.hit_count = 0
        # start == parent.end, kept as a field: hit rules and costs read it on every request
        self.start: int = parent.end if parent is not None else 0
        self.end: int = self.start + len(key)
        # the host tier's (radix/host.py): KV in host memory, children whose KV is there, and
        # the checkpoint at `end` when it is in host memory
        self.host = False
        self.host_children: dict[bytes, Node] = {}
        self.host_state: Pages | None = None
        self.host_copy: CleanCopy | None = None  # a device node's clean host copy

    def set_tombstone(self, slot: int, count: int) -> None:
        """Group `slot` has dropped its leading `count` tokens' pages (tombstones are a tuple)."""
        t = self.tombstones
        self.tombstones = (*t[:slot], count, *t[slot + 1 :])

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def path_from_root(self) -> list[Node]:
        """Nodes from the root's first child down to self (the root excluded)."""
        path: list[Node] = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            path.append(node)
            node = node.parent
        path.reverse()
        return path

    def subtree(self) -> Iterator[Node]:
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def __repr__(self) -> str:
        state = " state" if self.state is not None else ""
        state += " host_state" if self.host_state is not None else ""
        state += " host" if self.host else ""
        inner = f" inner={[at for at, _ in self.inner]}" if self.inner else ""
        return f"Node#{self.id}[{self.start},{self.end}){state}{inner} lock={self.lock_ref}"
