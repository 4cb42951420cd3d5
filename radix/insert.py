"""Insertion into the radix tree: a key's new tokens become a leaf (or grow one), and its
checkpoints split the path where they lie.

Functions over a `RadixTree` (tree.py), which holds the state and states the invariants they
keep; `RadixTree.insert` and `RadixTree.chain_below` are the entry points.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jenga_sglang.radix.match import Walk
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import Pages
from jenga_sglang.radix.spaces import root_for
from jenga_sglang.radix.tokens import TokenSeq

if TYPE_CHECKING:
    from jenga_sglang.radix.tree import RadixTree


def insert(
    tree: RadixTree,
    key: TokenSeq,
    start: int,
    kv: list[Pages],
    states: dict[int, Pages],
    now: int,
    walk: Walk | None = None,
    namespace: str | None = None,
) -> Node:
    """Cache `key` in `namespace` (None: the default one; spaces.py). The caller hands over
    pages it owns (used pages):

        key:  [0 ........ start) [start .................... len(key))
               pages borrowed     kv[g]: the caller's pages (sliding-window groups may
               from the tree      have dropped a leading run: tombstones)

    Positions the tree already holds are kept and the caller's duplicates freed; new
    positions become a new leaf. `states` maps exact positions p in (0, len(key)] to a
    one-page SSM checkpoint valid after tokens [0, p): the tree splits a node so that one
    ends at p (the state stays with the node whose end it represents). Returns the node
    ending at len(key). Bad input raises ValueError before anything changes.

    `walk` may pass `tree.walk(key)` when the caller has it (the tree must not have changed
    along its path since: e.g. its last node was locked meanwhile).
    """
    _validate_insert(tree, key, start, kv, states)
    if walk is None:
        walk = tree.walk(key, namespace=namespace)
    if walk.length < start:
        raise ValueError(
            f"insert claims {start} cached tokens but the tree holds only {walk.length} "
            "(lock the matched prefix while computing the rest)"
        )
    # A walk that found nothing starts at the namespace's root, made now if it has none (the
    # walk's own root may have been dropped since, when eviction emptied it).
    top = tree.root if namespace is None else root_for(tree, namespace)
    node = _node_ending_at(tree, walk, top)
    kv = _free_duplicates(tree, key, start, walk.length, kv, node)
    held = {p: st for p, st in states.items() if p <= walk.length}
    if walk.length < len(key):
        if _can_grow(tree, node, kv):
            _grow_leaf(tree, node, key.slice(walk.length), kv, now)
            held = dict(states)  # the grown leaf is split at its checkpoints below
        else:
            new = {p - walk.length: st for p, st in states.items() if p > walk.length}
            node = _add_leaf(tree, node, key.slice(walk.length), kv, now, new)
    _attach_states(tree, key, held, now, walk, top)
    return node


def _validate_insert(
    tree: RadixTree, key: TokenSeq, start: int, kv: list[Pages], states: dict[int, Pages]
) -> None:
    if not isinstance(key, TokenSeq):
        raise ValueError(f"insert key must be a TokenSeq, got {type(key).__name__}")
    size = len(key)
    if size == 0:
        raise ValueError("insert of an empty key")
    if not 0 <= start <= size:
        raise ValueError(f"start {start} outside [0, {size}]")
    if size % tree.page or start % tree.page:
        raise ValueError(
            f"insert of [{start}, {size}) in a tree of {tree.page}-token pages: whole pages only"
        )
    if len(kv) != len(tree.attention):
        raise ValueError(
            f"expected pages for {len(tree.attention)} attention groups, got {len(kv)}"
        )
    span = size - start
    for slot, group in enumerate(tree.attention):
        count = len(kv[slot])
        if count > span or (group.window is None and count < span):
            raise ValueError(f"group {group.name}: {count} pages for {span} new tokens")
    for pos, state in states.items():
        if tree.state_type is None:
            raise ValueError("states given but the model has no Mamba group")
        if not 0 < pos <= size:
            raise ValueError(f"checkpoint position {pos} outside (0, {size}]")
        if pos % tree.page:
            raise ValueError(f"checkpoint position {pos} is not on a {tree.page}-token page")
        if len(state) != 1:
            raise ValueError(f"a checkpoint is one state page, got {len(state)}")


def _node_ending_at(tree: RadixTree, walk: Walk, top: Node) -> Node:
    """The node ending exactly where `walk` stops, splitting its last node if needed (`top`,
    the root of the walk's namespace, when it stops there)."""
    if not walk.path:
        return top
    last = walk.path[-1]
    if last.end > walk.length:
        return tree.split(last, walk.length - last.start)
    return last


def _descend_splitting(
    tree: RadixTree, key: TokenSeq, length: int, node: Node, pos: int = 0
) -> Node:
    """The node ending exactly at `length` along `key` (which the tree holds), splitting.

    Starts from `node`, which ends at `pos` on the same path (a root, at 0).
    """
    while pos < length:
        child = node.children[key.head(pos, tree.page)]
        if pos + len(child.key) > length:
            child = tree.split(child, length - pos)
        node, pos = child, pos + len(child.key)
    return node


def chain_below(
    tree: RadixTree, key: TokenSeq, at: int, namespace: str | None = None
) -> list[Node]:
    """The nodes holding `key`'s tokens [at, len(key)) in `namespace`, top-down, when nothing
    else passes there (each has one child, the last is a leaf ending at len(key)); else [].
    The node holding position `at` is split so that a node starts exactly there. The tree
    must hold all of `key` (it was just inserted)."""
    top = tree.top(namespace)
    if not 0 < at < len(key) or top is None:
        return []
    node = _descend_splitting(tree, key, at, top)
    chain: list[Node] = []
    while node.end < len(key):
        if chain and len(node.children) != 1:
            return []
        node = node.children[key.head(node.end, tree.page)]
        chain.append(node)
    return chain if chain and not chain[-1].children else []


def _attach_states(
    tree: RadixTree, key: TokenSeq, states: dict[int, Pages], now: int, walk: Walk, top: Node
) -> None:
    """Attach checkpoints in one walk down the path (positions ascending), each descent
    starting from the deepest node of `walk` that ends at or above it (else from `top`, the
    namespace's root): those nodes are on `key`'s path still (an insert only splits them,
    and grows the last), so the tokens above them are not compared again."""
    node, pos = top, 0
    for at in sorted(states):
        for held in walk.path:
            if pos < held.end <= at:
                node, pos = held, held.end
        node = _descend_splitting(tree, key, at, node, pos)
        pos = at
        _attach_state(tree, node, states[at], now)


def _free_duplicates(
    tree: RadixTree, key: TokenSeq, start: int, present: int, kv: list[Pages], node: Node
) -> list[Pages]:
    """Free the caller's pages for [start, present) and return those for [present, end).

    Where the tree dropped a window group's pages (tombstones) and the caller brings them,
    the tree takes the caller's instead (`_revive_windows`): the same tokens' KV, so a hit
    inside that window is valid again. `node` ends at `present` on the key's path."""
    span = len(key) - start
    dup = present - start
    rest: list[Pages] = []
    for slot, ptype in enumerate(tree.kv_types):
        pages = kv[slot]
        dropped = span - len(pages)  # sliding-window tombstones lead the span
        cut = max(0, dup - dropped)
        head, tail = pages.split(cut)
        if len(head) and tree.attention[slot].window is not None:
            spare = _revive_windows(tree, slot, node, present - len(head), head)
        else:
            spare = [head]
        for pages in spare:
            if len(pages):
                tree.memory.free(ptype, pages)
        rest.append(tail)
    return rest


def _revive_windows(
    tree: RadixTree, slot: int, node: Node, first: int, pages: Pages
) -> list[Pages]:
    """Give the nodes above `node` (ending at first + len(pages)) the caller's window pages of
    `slot` for [first, ...) where they hold tombstones; returns the pages not taken.

    A node's tombstones are a leading run [start, start + t) and the caller's pages a
    contiguous run ending at the node's end, so what is revived, [max(start, first),
    start + t), is the tail of the run: the tombstones left still lead the edge."""
    ptype = tree.kv_types[slot]
    spare: list[Pages] = []
    taken_to = first + len(pages)  # pages[: taken_to - first] not yet handed out
    n: Node | None = node
    while n is not None and n.parent is not None and n.end > first:
        tomb = n.tombstones[slot]
        lo, hi = max(n.start, first), n.start + tomb
        if lo < hi:
            before, rest = pages.split(hi - first)
            if taken_to > hi:
                spare.append(rest.split(taken_to - hi)[0])
            before, revived = before.split(lo - first)
            n.kv[slot] = revived.concat(n.kv[slot])
            n.set_tombstone(slot, lo - n.start)
            if n.lock_ref == 0:
                tree.memory.mark_evictable(ptype, revived)
            tree.policy.update(n)
            pages, taken_to = before, lo
        n = n.parent
    if taken_to > first:
        spare.append(pages.split(taken_to - first)[0])
    return spare


def _add_leaf(
    tree: RadixTree,
    parent: Node,
    key: TokenSeq,
    kv: list[Pages],
    now: int,
    states: dict[int, Pages] | None = None,
) -> Node:
    """Hang `key` below `parent` as a new leaf, as a chain of nodes ending at checkpoints.

    `states` maps offsets into `key` (0 < offset <= len(key)) to checkpoints. Building the
    chain directly gives the nodes, pages and ids that adding one leaf and splitting it at
    each offset in turn would (the leaf takes the first id, the nodes above it the next
    ones top-down), without re-slicing the leaf once per checkpoint. A tree that keeps runs
    makes them one leaf with inner checkpoints instead.
    """
    states = states or {}
    cuts = sorted(at for at in states if at < len(key))
    inner: tuple[tuple[int, Pages], ...] = ()
    if tree.keeps_runs and cuts:
        inner = tuple((parent.end + at, states[at]) for at in cuts)
        cuts = []
    for slot, ptype in enumerate(tree.kv_types):
        if len(kv[slot]):
            tree.memory.mark_evictable(ptype, kv[slot])
    leaf_id = tree.new_id()
    tombstones = [len(key) - len(pages) for pages in kv]  # sliding windows: leading run
    chain: list[Node] = []
    node, pos = parent, 0
    for cut in cuts:
        upper_kv: list[Pages] = []
        upper_tomb: list[int] = []
        for slot, pages in enumerate(kv):
            upper_tomb.append(min(tombstones[slot], cut - pos))
            head, kv[slot] = pages.split(cut - pos - upper_tomb[-1])
            upper_kv.append(head)
            tombstones[slot] -= upper_tomb[-1]
        upper = Node(tree.new_id(), key.slice(pos, cut), node, upper_kv, upper_tomb, now)
        node.children[key.head(pos, tree.page)] = upper
        chain.append(upper)
        node, pos = upper, cut
    leaf = Node(leaf_id, key.slice(pos), node, kv, tombstones, now)
    node.children[key.head(pos, tree.page)] = leaf
    chain.append(leaf)
    leaf.inner = inner
    for _, checkpoint in inner:
        assert tree.state_type is not None
        tree.memory.mark_evictable(tree.state_type, checkpoint)
    for created in chain:
        state = states.get(created.end - parent.end)
        if state is not None:
            # `_attach_state` on a fresh, unlocked node without a state: no checks needed
            assert tree.state_type is not None
            created.state = state
            tree.memory.mark_evictable(tree.state_type, state)
        tree.policy.update(created)
    if parent.parent is not None:  # not a root
        tree.policy.update(parent)
    return leaf


def _can_grow(tree: RadixTree, node: Node, kv: list[Pages]) -> bool:
    """Whether new tokens after `node` extend its edge instead of hanging a child on it.

    With a Mamba group a hit ends only at a checkpoint, so the end of a leaf without one
    is no reuse point: it exists only because the tokens arrived in two inserts (SGLang
    checkpoints a running request's prefill, then inserts its decode when it finishes).
    Growing the leaf keeps the tree what one insert of the whole sequence would build, so
    eviction weighs the same nodes whichever driver filled it. Not with sliding-window
    tombstones in the new pages (a node's tombstones must lead its edge).
    """
    return (
        tree.state_type is not None
        and node.parent is not None
        and node.is_leaf
        and node.state is None
        and not node.host_children  # host children hang at its end (radix/host.py)
        and node.host_state is None
        and all(t == 0 for t in node.tombstones)
        and all(len(pages) == len(kv[0]) for pages in kv)
    )


def _grow_leaf(tree: RadixTree, node: Node, key: TokenSeq, kv: list[Pages], now: int) -> None:
    """Append `key` and its pages (the caller's, used) to the stateless leaf `node`."""
    if len(kv[0]) != len(key):
        raise AssertionError(f"growing {node!r} by {len(key)} tokens with {len(kv[0])} pages")
    for slot, ptype in enumerate(tree.kv_types):
        pages = kv[slot]
        node.kv[slot] = node.kv[slot].concat(pages)
        if node.lock_ref == 0 and len(pages):
            tree.memory.mark_evictable(ptype, pages)
    node.key = node.key.concat(key)
    node.end += len(key)
    node.last_access = max(node.last_access, now)
    tree.policy.update(node)


def _attach_state(tree: RadixTree, node: Node, state: Pages, now: int) -> None:
    assert tree.state_type is not None
    if node.parent is None or node.state is not None:
        tree.memory.free(tree.state_type, state)  # already checkpointed there
        return
    if node.host_state is not None:
        # the same checkpoint, freshly computed on the device: its host copy is not needed
        assert tree.host is not None
        tree.host.drop_host_state(node)
    node.state = state
    # Admitting a checkpoint is an access: a branch point split out of an old edge would
    # otherwise keep that edge's old time and look stale the moment it becomes useful.
    node.last_access = max(node.last_access, now)
    if node.lock_ref == 0:
        tree.memory.mark_evictable(tree.state_type, state)
    tree.policy.update(node)
