"""Eviction from the radix tree: the policy's victim leaves whole (a leaf), loses its last
segment (a leaf run), or loses its checkpoint (an inner node, merged into an only child).

Functions over a `RadixTree` (tree.py), which holds the state and states the invariants they
keep; the memory reaches them through `RadixTree.evict_for`, its `Evictor` callback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jenga_sglang.radix.host_copy import merge as merge_copies
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import PageType
from jenga_sglang.radix.spaces import forget_if_empty

if TYPE_CHECKING:
    from jenga_sglang.radix.tree import RadixTree


def evict_for(tree: RadixTree, ptype: PageType) -> bool:
    """Evictor callback of the memory: evict the policy's next victim. Short of a window
    group's pages, first drop what lies out of every window (`trim_window`)."""
    if ptype in tree.kv_types:
        slot = tree.kv_types.index(ptype)
        if tree.attention[slot].window is not None and trim_window(tree, slot):
            return True
    victim = tree.policy.victim()
    if victim is None:
        return False
    host = tree.host
    if host is not None and host.evict(victim):
        return True  # moved to host memory (radix/host.py); otherwise it is dropped below
    if victim.children:
        drop_state(tree, victim)
    elif victim.inner:
        _evict_last_segment(tree, victim)
    else:
        evict_leaf(tree, victim)
    return True


def evict_leaf(tree: RadixTree, node: Node) -> None:
    """Free everything an unlocked leaf holds and remove it (a run: all its segments)."""
    if node.parent is None or node.children or node.lock_ref:
        raise ValueError(f"cannot evict {node!r}: only unlocked leaves are evicted whole")
    for slot, ptype in enumerate(tree.kv_types):
        if len(node.kv[slot]):
            tree.memory.free_evictable(ptype, node.kv[slot])
    states = [state for _, state in node.inner]
    if node.state is not None:
        states.append(node.state)
    for state in states:
        assert tree.state_type is not None
        tree.memory.free_evictable(tree.state_type, state)
    tree.evicted_states += len(states)
    parent = node.parent
    assert parent is not None
    del parent.children[node.key.head(0, tree.page)]
    node.parent = None
    tree.policy.remove(node)
    tree.evicted_nodes += 1 + len(node.inner)
    if parent.parent is not None:
        tree.policy.update(parent)
    elif parent is not tree.root:
        forget_if_empty(tree, parent)  # a namespace's last node: its root goes too


def _evict_last_segment(tree: RadixTree, run: Node) -> None:
    """Evict the chain's leaf out of an unlocked leaf run: the pages and state of
    [last inner checkpoint, end). The run then ends at that checkpoint, with its state."""
    if run.children or run.lock_ref or not run.inner:
        raise ValueError(f"cannot evict the last segment of {run!r}: not an unlocked leaf run")
    at, state = run.inner[-1]
    keep = at - run.start
    for slot, ptype in enumerate(tree.kv_types):
        tomb = run.tombstones[slot]
        head, tail = run.kv[slot].split(max(0, keep - tomb))
        if len(tail):
            tree.memory.free_evictable(ptype, tail)
        run.kv[slot] = head
        run.set_tombstone(slot, min(tomb, keep))
    if run.state is not None:
        assert tree.state_type is not None
        tree.memory.free_evictable(tree.state_type, run.state)
        tree.evicted_states += 1
    run.state = state
    run.inner = run.inner[:-1]
    run.key = run.key.truncated(keep)  # no copy: the key only ever shrinks from here
    run.end = at
    tree.evicted_nodes += 1


def drop_state(tree: RadixTree, node: Node) -> None:
    """Evict an inner node's checkpoint, keeping its KV (every token stays cached).

    With one child the node disappears: the child absorbs its edge and KV (Marconi). With
    more children, or children in host memory (a merge would move them off its end), the
    node stays as the branch point, without a state.
    """
    if node.lock_ref or not node.children or node.state is None:
        raise ValueError(
            f"cannot drop the state of {node!r}: needs an unlocked inner node with a checkpoint"
        )
    assert tree.state_type is not None and node.parent is not None
    tree.memory.free_evictable(tree.state_type, node.state)
    node.state = None
    tree.evicted_states += 1
    if len(node.children) == 1 and not node.host_children:
        _merge_into_child(tree, node)
    else:
        tree.policy.update(node)


def _merge_into_child(tree: RadixTree, node: Node) -> None:
    assert node.parent is not None
    (child,) = node.children.values()
    if tree.host is not None:
        merge_copies(tree.host, node, child)  # radix/host_copy.py
    for slot, ptype in enumerate(tree.kv_types):
        if child.tombstones[slot]:
            # The child's leading pages are gone, so no hit beyond node.end can use the
            # node's window pages either: they become tombstones too.
            if len(node.kv[slot]):
                tree.memory.free_evictable(ptype, node.kv[slot])
            child.set_tombstone(slot, child.tombstones[slot] + len(node.key))
        else:
            child.kv[slot] = node.kv[slot].concat(child.kv[slot])
            child.set_tombstone(slot, node.tombstones[slot])
    child.key = node.key.concat(child.key)
    child.inner = node.inner + child.inner
    child.parent = node.parent
    child.start = node.start
    node.parent.children[child.key.head(0, tree.page)] = child
    node.parent = None
    node.children = {}
    tree.policy.remove(node)
    tree.policy.update(child)


def trim_window(tree: RadixTree, slot: int) -> bool:
    """Free the window pages of group `slot` that no hit at a node end can use, in the least
    recently used node that has any; False when no node has.

    A hit at p needs the window's last w tokens [p - w, p) (rules.py). Every node end at or
    below a node lies at or past its end, so of a node [start, end) only [end - w, end)
    serves those hits: the part before it (whole pages) is what Jenga evicts first for a
    sliding-window layer. It serves only hits that end inside the edge, where a later
    request leaves it. Full-attention pages stay: every token of the edge is still cached.

    Locked nodes too: a request holding a lock reads the window before the end of its locked
    node or past it (the lock node ends where the request's cached prefix ends, and hits
    end there, PrefixCache.anchor), never before end - w, so a long prompt being prefilled
    keeps a window, not its whole length. One scan of the tree per call (the memory calls
    until it has room)."""
    window = tree.attention[slot].window
    assert window is not None
    page = tree.page
    best: Node | None = None
    best_cut = 0
    for node in tree.nodes():
        if node.inner:
            continue
        cut = max(0, node.end - window - node.start)
        cut -= cut % page
        if cut > node.tombstones[slot] and (best is None or node.last_access < best.last_access):
            best, best_cut = node, cut
    if best is None:
        return False
    tomb = best.tombstones[slot]
    gone, best.kv[slot] = best.kv[slot].split(best_cut - tomb)
    best.set_tombstone(slot, best_cut)
    ptype = tree.kv_types[slot]
    if best.lock_ref:
        tree.memory.free(ptype, gone)
    else:
        tree.memory.free_evictable(ptype, gone)
    tree.policy.update(best)
    return True
