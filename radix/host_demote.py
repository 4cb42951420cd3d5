"""Demotions: moving a device eviction's victim into host memory (docs/host-tier.md).

`HostTier.evict` (radix/host.py) decides; these move. A leaf moves whole (KV of every group
and its checkpoint) into its parent's `host_children`; an inner node's checkpoint moves to
`host_state`, its KV stays. Where the victim still has a clean copy from its last load-back
(radix/host_copy.py), the copy's pages become its host pages and only what the copy lacks is
written: per group, the device pages before the copy's part and after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jenga_sglang.radix.host_copy import discard, take_kv, take_state
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import OutOfMemory, Pages, PageType

if TYPE_CHECKING:
    from jenga_sglang.radix.host import HostTier

#: one move of a leaf: its page type, its device pages, and what a copy holds of them
#: (device pages before the copy's part, the copy's pages), or None
Move = tuple[PageType, Pages, tuple[int, Pages] | None]


def demote_state(host: HostTier, node: Node) -> bool:
    """Move an inner node's checkpoint to host memory (False: host memory cannot take it)."""
    state = node.state
    state_type = host.tree.state_type
    assert state is not None and state_type is not None
    copy = take_state(host, node)
    if copy is not None:
        _keep(host, state_type, state, copy)
    else:
        try:
            copy = host.memory.alloc(state_type, len(state), 0)
        except OutOfMemory:
            return False
        _write(host, state_type, state, copy)
    host.tree.memory.free_evictable(state_type, state)
    node.state, node.host_state = None, copy
    host.demoted_states += 1
    host.tree.policy.update(node)
    host.policy.host.update(node)
    return True


def demote_leaf(host: HostTier, node: Node) -> bool:
    """Move an unlocked device leaf (a run: its last segment) whole into host memory (False:
    host memory cannot take it; what its copy held is freed)."""
    tree = host.tree
    if node.inner:  # a run: the chain's leaf is [last inner checkpoint, end)
        tree.split(node, node.inner[-1][0] - node.start)
    moves: list[Move] = [
        (ptype, node.kv[slot], part)
        for (slot, ptype), part in zip(enumerate(tree.kv_types), take_kv(host, node), strict=True)
    ]
    if node.state is not None:
        assert tree.state_type is not None
        state = take_state(host, node)
        moves.append((tree.state_type, node.state, None if state is None else (0, state)))
    discard(host, node)  # what the copy has left is not the node's
    wants = [(t, len(p) - (0 if c is None else len(c[1]))) for t, p, c in moves]
    fresh = host.memory.try_alloc_all(wants, 0)
    if fresh is None:
        for ptype, _, part in moves:
            if part is not None and len(part[1]):
                host.memory.free_evictable(ptype, part[1])
        return False
    placed = [_place(host, move, pages) for move, pages in zip(moves, fresh, strict=True)]
    for ptype, pages, _ in moves:
        if len(pages):
            tree.memory.free_evictable(ptype, pages)
    for slot in range(len(tree.kv_types)):
        node.kv[slot] = placed[slot]
    if node.state is not None:
        node.state, node.host_state = None, placed[-1]
    _link_host(host, node)
    return True


def _place(host: HostTier, move: Move, fresh: Pages) -> Pages:
    """The host pages of one move: `fresh` pages written for what the copy lacks (before its
    part, then after it), the copy's own pages kept in between."""
    ptype, device, part = move
    if part is None:
        if len(device):
            _write(host, ptype, device, fresh)
        return fresh
    skip, copy = part
    head, rest = device.split(skip)
    middle, tail = rest.split(len(copy))
    before, after = fresh.split(skip)
    for src, dst in ((head, before), (tail, after)):
        if len(src):
            _write(host, ptype, src, dst)
    if len(middle):
        _keep(host, ptype, middle, copy)
    return before.concat(copy).concat(after)


def _link_host(host: HostTier, node: Node) -> None:
    """`node` now holds host pages only: it moves to its parent's `host_children` (T1)."""
    tree = host.tree
    parent = node.parent
    assert parent is not None
    head = node.key.head(0, tree.page)
    del parent.children[head]
    parent.host_children[head] = node
    node.host = True
    host.demoted_nodes += 1
    tree.policy.remove(node)
    if parent is not tree.root:
        tree.policy.update(parent)
    host.policy.host.update(node)


def _write(host: HostTier, ptype: PageType, device: Pages, target: Pages) -> None:
    """Copy device pages into freshly allocated host pages (the caller frees the device's)."""
    if host.copies is not None:
        host.copies.store(ptype, device, target)
    host.memory.mark_evictable(ptype, target)
    host.write_bytes += len(device) * host.memory.page_bytes(ptype)


def _keep(host: HostTier, ptype: PageType, device: Pages, copy: Pages) -> None:
    """Demote onto a clean copy's pages (evictable host memory already): nothing copied."""
    if host.copies is not None:
        host.copies.kept(ptype, device, copy)
    host.kept_bytes += len(device) * host.memory.page_bytes(ptype)
