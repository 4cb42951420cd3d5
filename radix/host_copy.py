"""Clean host copies: what a load-back leaves in host memory (docs/host-tier.md, "Clean copies").

A load-back copies a host node's pages to the device, and the host pages still hold the same
bytes. Kept as the node's `host_copy`, they make its next demotion free: the device pages go
and the copy becomes the node's host pages again, nothing written. Without them the tier wrote
an entry to host every time device eviction demoted it, where HiCache's write-through policies
write a node once and keep that copy.

Host memory holds a copy as long as its node stays on the device, and gives copies up only
when no host entry is left to evict (`HostTier.evict_for`), as HiCache's host keeps what it
backed of a device node. Copies never take more than the device's size of host memory, but
what they take is host entries' room, so small devices lose some host hits (bench/RESULTS.md,
"Clean host copies"). The live tier copies synchronously, on the scheduler's critical path
(binding/host/copies.py): there the writes saved outweigh the hits lost in every measured
configuration. Freeing copies first kept every hit but saved little: host memory stays full,
so the next demotion evicted the copy before its node came down again.

T6 (checked by `check_copies`): a node has a copy exactly when it is in its tier's `clean`;
it is a device node of the tree; the copy holds pages, and they are evictable host memory; a
copied checkpoint is the node's device one (at its end, which no change of shape moves while
it is there). A copy covers one run of positions per attention group and follows its node
through splits and merges; a demotion writes what it lacks (an insert grew the leaf, window
pages were revived, a merge joined a node without one) and keeps the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jenga_sglang.radix.node import CleanCopy, Node
from jenga_sglang.radix.pages import Pages, PageType

if TYPE_CHECKING:
    from jenga_sglang.radix.host import HostTier


def keep(host: HostTier, node: Node, kv: list[Pages] | None, state: Pages | None) -> None:
    """`node` was just loaded from these host pages (its KV, ending at its end, and/or its
    checkpoint): keep them as its copy instead of freeing them."""
    copy = node.host_copy
    if copy is None:
        copy = node.host_copy = CleanCopy([], node.end, None)
    if kv is not None:
        assert not copy.kv, f"{node!r}: a second KV copy"
        copy.kv, copy.kv_end = kv, node.end
    if state is not None:
        assert copy.state is None, f"{node!r}: a second checkpoint copy"
        copy.state = state
    host.clean.pop(node, None)
    host.clean[node] = None  # the newest copy: the last to go


def split(host: HostTier, upper: Node, lower: Node) -> None:
    """`tree.split` just cut `lower`'s edge at `upper.end`: the copy's pages of positions
    before the cut go with `upper`; the checkpoint stays with `lower`, whose end did not move."""
    copy = lower.host_copy
    if copy is None or not copy.kv:
        return
    cut, above = upper.end, []
    for slot, pages in enumerate(copy.kv):
        head, copy.kv[slot] = pages.split(min(len(pages), max(0, cut - _first(copy, slot))))
        above.append(head)
    if any(len(pages) for pages in above):
        upper.host_copy = CleanCopy(above, min(copy.kv_end, cut), None)
        host.clean[upper] = None
    if not any(len(pages) for pages in copy.kv):
        copy.kv = []
        if copy.state is None:
            discard(host, lower)


def merge(host: HostTier, node: Node, child: Node) -> None:
    """`node` is about to merge into its only `child` (radix/evict.py): the child keeps one
    run of copied pages per group, both copies joined where they meet, else `node`'s (its
    head), else its own; the checkpoint copy at its end stays."""
    copy, below = node.host_copy, child.host_copy
    if copy is None:
        return
    host.clean.pop(node, None)
    node.host_copy = None
    kv, kv_end = copy.kv, copy.kv_end
    if below is not None and below.kv and kv:
        if kv_end == node.end and all(
            _first(below, slot) == node.end for slot in range(len(below.kv))
        ):
            kv, kv_end = [a.concat(b) for a, b in zip(kv, below.kv, strict=True)], below.kv_end
        else:
            _free_kv(host, below)
    elif below is not None and below.kv:
        kv, kv_end = below.kv, below.kv_end
    _free_state(host, copy)  # at node's end, which stops being a node end
    state = None if below is None else below.state
    if kv or state is not None:
        child.host_copy = CleanCopy(kv, kv_end, state)
        host.clean.pop(child, None)
        host.clean[child] = None
    elif below is not None:
        discard(host, child)


def take_kv(host: HostTier, node: Node) -> list[tuple[int, Pages] | None]:
    """Per attention group, what of `node`'s device pages its copy holds, for a demotion: the
    device pages before the copy's part and the copy's pages (the rest of the copy freed), or
    None where it holds none of them. The copy leaves `clean` either way: the demotion's own
    host allocation must not evict it."""
    copy = node.host_copy
    host.clean.pop(node, None)
    tree = host.tree
    out: list[tuple[int, Pages] | None] = [None] * len(tree.kv_types)
    if copy is None or not copy.kv:
        return out
    for slot, ptype in enumerate(tree.kv_types):
        pages = copy.kv[slot]
        device = node.end - len(node.kv[slot])  # the device's pages: [device, end)
        first = _first(copy, slot)
        lo, hi = max(device, first), min(node.end, copy.kv_end)
        if hi <= lo:
            lead = pages
        else:
            lead, pages = pages.split(lo - first)
            pages, trail = pages.split(hi - lo)
            lead = lead.concat(trail)
            out[slot] = (lo - device, pages)
        if len(lead):
            host.memory.free_evictable(ptype, lead)
    copy.kv = []
    return out


def take_state(host: HostTier, node: Node) -> Pages | None:
    """The copy's checkpoint as `node`'s host checkpoint for a demotion, or None (none kept)."""
    copy = node.host_copy
    if copy is None or copy.state is None:
        return None
    state, copy.state = copy.state, None
    if not copy.kv:  # nothing left: the node has no copy
        discard(host, node)
    return state


def _first(copy: CleanCopy, slot: int) -> int:
    """The first position group `slot`'s copied pages hold."""
    return copy.kv_end - len(copy.kv[slot])


def drop_copied_state(host: HostTier, node: Node) -> None:
    """`node`'s device checkpoint is being dropped: the copy of it goes too."""
    copy = node.host_copy
    if copy is None or copy.state is None:
        return
    _free_state(host, copy)
    if not copy.kv:
        discard(host, node)


def discard(host: HostTier, node: Node) -> None:
    """Free what `node`'s copy still holds and forget it."""
    copy = node.host_copy
    if copy is None:
        return
    host.clean.pop(node, None)
    node.host_copy = None
    _free_kv(host, copy)
    _free_state(host, copy)


def _free_state(host: HostTier, copy: CleanCopy) -> None:
    if copy.state is not None:
        assert host.tree.state_type is not None
        host.memory.free_evictable(host.tree.state_type, copy.state)
        copy.state = None


def _free_kv(host: HostTier, copy: CleanCopy) -> None:
    for slot, ptype in enumerate(host.tree.kv_types):
        if copy.kv and len(copy.kv[slot]):
            host.memory.free_evictable(ptype, copy.kv[slot])
    copy.kv = []


def evict_oldest(host: HostTier) -> bool:
    """Host memory's last resort when short: free the oldest copy. False when none."""
    if not host.clean:
        return False
    discard(host, next(iter(host.clean)))
    return True


def check_copies(host: HostTier, device_nodes: list[Node]) -> list[tuple[PageType, Pages]]:
    """Assert T6 over the tree's device nodes; each copy's page runs with their type, for the
    tier's page count."""
    held: list[tuple[PageType, Pages]] = []
    tree = host.tree
    copied = [n for n in device_nodes if n.host_copy is not None]
    assert len(copied) == len(host.clean) and all(n in host.clean for n in copied), (
        f"{len(copied)} device nodes hold a host copy, {len(host.clean)} are listed"
    )
    for node in copied:
        copy = node.host_copy
        assert copy is not None and not node.host and node.parent is not None, f"{node!r} copy"
        assert copy.kv or copy.state is not None, f"{node!r}: an empty copy"
        assert copy.state is None or node.state is not None, f"{node!r}: a copy of no state"
        held.extend(zip(tree.kv_types, copy.kv, strict=False))  # no KV copy: an empty list
        if copy.state is not None:
            assert tree.state_type is not None
            held.append((tree.state_type, copy.state))
    return held
