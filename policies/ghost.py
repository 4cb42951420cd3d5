"""Ghost entries: the token ids of recently finished sequences, without their pages.

Speculative insertion finds where a request leaves the tree, and checkpoints that point so the
next request resuming there gets a hit. Once a sequence's pages are evicted, the tree forgets
its tokens too, so a request that rewrote the middle of an evicted history (an agent eliding
an old observation) seems to leave the tree at the shared system prompt: its real branch point
is lost, no state is captured there, and its successor misses as well. A `GhostIndex` keeps
the token ids of recently finished sequences in a radix trie of their own, at 4 bytes a token
instead of the tens of kilobytes their KV takes, so the admission can still find that branch
point and checkpoint it exactly (ghost entries in the sense of ARC's ghost lists).

    tree:   root ── [0, 400) shared prompt                    (the history was evicted)
    ghost:  root ── [0, 400) ── [400, 3100) ──┬── [3100, 7200)   the previous request
                                              └── the new input leaves it here: branch 3100

The trie is bounded by `capacity` tokens: the least recently used leaves go first. A sequence
longer than the capacity is remembered up to it. Nothing here holds pages or states, so the
ghost never constrains the cache; it only answers `branch(tokens)`.

Sequences of different namespaces (LoRA adapters, cache salts; radix/spaces.py) are kept
under roots of their own, as the tree keeps them, so a branch point is only ever found among
the sequences of the asking request's namespace; one capacity and one LRU order serve all of
them, and a named root goes when its last sequence is forgotten.
"""

from __future__ import annotations

import heapq

from mypy_extensions import mypyc_attr

from jenga_sglang.radix.contracts import Branch
from jenga_sglang.radix.tokens import TokenSeq


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class _Entry:
    __slots__ = ("children", "end", "id", "key", "last_use", "parent")

    def __init__(
        self, entry_id: int, key: TokenSeq, parent: _Entry | None, end: int, now: int
    ) -> None:
        self.id = entry_id
        self.key = key
        self.parent = parent
        self.children: dict[bytes, _Entry] = {}
        self.end = end  # position after the last token of `key`
        self.last_use = now


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class GhostIndex:
    """Token ids of recently finished sequences, bounded by `capacity` tokens (LRU leaves)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"ghost capacity must be >= 1 token, got {capacity}")
        self.capacity = capacity
        self.root = _Entry(0, TokenSeq(b""), None, 0, 0)  # the default namespace's
        self._spaces: dict[str, _Entry] = {}  # the named namespaces' roots
        self._space_names: dict[int, str] = {}  # a named root's id -> its namespace
        self._next_id = 1
        self._clock = 0
        self._held = 0  # tokens over all edges
        self._entries: dict[int, _Entry] = {}
        self._leaves: list[tuple[int, int]] = []  # (last_use, id), stale keys skipped lazily

    def __len__(self) -> int:
        """Tokens held (each shared prefix counted once)."""
        return self._held

    # ------------------------------------------------------------------ queries

    def branch(self, tokens: TokenSeq, namespace: str | None = None) -> Branch:
        """Where `tokens` leave the remembered sequences of `namespace` (no side effects).

        `tail` is, for a branch in the middle of an edge, how many remembered tokens follow
        the branch point down to the end of the one sequence through that edge (0 where the
        trie forks below): as `Walk.branch` reports it for the tree. Ghosts hold no states,
        so `checkpointed` is always False.
        """
        top = self.root if namespace is None else self._spaces.get(namespace)
        if top is None:
            return Branch(0, True, False, 0, 0)  # nothing remembered there: an empty root's
        node, pos, size = top, 0, len(tokens)
        while pos < size:
            child = node.children.get(tokens.head(pos))
            if child is None:
                break
            n = child.key.common_prefix(tokens, pos)
            pos += n
            if n < len(child.key):
                return Branch(pos, False, False, 1, _tail(child, pos))
            node = child
        return Branch(pos, True, False, len(node.children), 0)

    # ------------------------------------------------------------------ updates

    def remember(self, tokens: TokenSeq, namespace: str | None = None) -> None:
        """Add a finished sequence of `namespace` (or refresh it), then forget the least recent
        ones that do not fit."""
        if len(tokens) > self.capacity:
            tokens = tokens.slice(0, self.capacity)
        if namespace is not None and not len(tokens):
            return  # nothing to remember, and no root to make for it
        self._clock += 1
        node, pos, size = self._root_for(namespace), 0, len(tokens)
        while pos < size:
            child = node.children.get(tokens.head(pos))
            if child is None:
                break
            n = child.key.common_prefix(tokens, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_use = self._clock
            node, pos = child, pos + n
        if pos < size and not node.children and node.parent is not None:
            self._grow(node, tokens.slice(pos))  # a continuation of a remembered sequence
        elif pos < size:
            node = self._add(node, tokens.slice(pos))
        elif not node.children and node.parent is not None:
            heapq.heappush(self._leaves, (self._clock, node.id))
        self._shrink()

    def _root_for(self, namespace: str | None) -> _Entry:
        """The root of `namespace`'s sequences, made on its first sequence."""
        if namespace is None:
            return self.root
        root = self._spaces.get(namespace)
        if root is None:
            root = _Entry(self._new_id(), TokenSeq(b""), None, 0, 0)
            self._spaces[namespace] = root
            self._space_names[root.id] = namespace
        return root

    def _add(self, parent: _Entry, key: TokenSeq) -> _Entry:
        leaf = _Entry(self._new_id(), key, parent, parent.end + len(key), self._clock)
        parent.children[key.head(0)] = leaf
        self._entries[leaf.id] = leaf
        self._held += len(key)
        heapq.heappush(self._leaves, (self._clock, leaf.id))
        return leaf

    def _grow(self, leaf: _Entry, key: TokenSeq) -> None:
        """Extend `leaf`'s edge instead of hanging a child on it: a chat session's turns then
        stay one entry (no trie level per turn, fewer objects to walk and to pickle)."""
        leaf.key = leaf.key.concat(key)
        leaf.end += len(key)
        self._held += len(key)
        heapq.heappush(self._leaves, (self._clock, leaf.id))

    def _split(self, node: _Entry, at: int) -> _Entry:
        """Cut `node`'s edge after `at` tokens; returns the new upper entry."""
        assert node.parent is not None and 0 < at < len(node.key)
        start = node.end - len(node.key)
        upper = _Entry(self._new_id(), node.key.slice(0, at), node.parent, start + at, 0)
        upper.last_use = node.last_use
        node.parent.children[upper.key.head(0)] = upper
        node.key = node.key.slice(at)
        node.parent = upper
        upper.children[node.key.head(0)] = node
        self._entries[upper.id] = upper
        return upper

    def _shrink(self) -> None:
        """Forget least recently used leaves until the tokens fit. Terminates: every pop
        removes a heap key, and a leaf is pushed only when it stops having children."""
        while self._held > self.capacity and self._leaves:
            last_use, entry_id = heapq.heappop(self._leaves)
            leaf = self._entries.get(entry_id)
            if leaf is None or leaf.children or leaf.last_use != last_use:
                continue  # stale: gone, no longer a leaf, or used since
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key.head(0)]
            del self._entries[entry_id]
            self._held -= len(leaf.key)
            if parent.children:
                continue
            if parent.parent is not None:
                heapq.heappush(self._leaves, (parent.last_use, parent.id))
            elif parent is not self.root:  # a namespace's last sequence: its root goes too
                del self._spaces[self._space_names.pop(parent.id)]
        if len(self._leaves) > 2 * len(self._entries) + 64:  # drop stale keys now and then
            self._leaves = [(e.last_use, e.id) for e in self._entries.values() if not e.children]
            heapq.heapify(self._leaves)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    # ------------------------------------------------------------------ integrity

    def check_integrity(self) -> None:
        """Links, positions and the token count agree; the count is within capacity."""
        for name, root in self._spaces.items():
            assert self._space_names.get(root.id) == name and root.children, f"root {name!r}"
        assert len(self._space_names) == len(self._spaces), "ghost namespace names out of step"
        held, seen, stack = 0, 0, [self.root, *self._spaces.values()]
        while stack:
            node = stack.pop()
            for head, child in node.children.items():
                assert child.parent is node, f"ghost entry {child.id}: wrong parent"
                assert child.key.head(0) == head and len(child.key) > 0
                assert child.end == node.end + len(child.key)
                assert self._entries.get(child.id) is child
                held += len(child.key)
                seen += 1
                stack.append(child)
        assert held == self._held, f"ghost holds {held} tokens, counted {self._held}"
        assert seen == len(self._entries), "ghost entries detached from the trie"
        assert self._held <= self.capacity


def _tail(node: _Entry, at: int) -> int:
    """Tokens from `at` (inside `node`'s edge) to the end of the one remembered sequence
    through it; 0 when the trie forks below."""
    while len(node.children) == 1:
        (node,) = node.children.values()
    return node.end - at if not node.children else 0
