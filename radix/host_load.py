"""Loading a hit back from the host tier before the request is admitted (docs/host-tier.md).

`prepare` runs in `PrefixCache.serve` between the match and the admission. It finds the hit
the host tier offers (H, with host KV and host checkpoints) and the device alone (D <= H),
asks the tier policy whether loading [D, H) beats recomputing it, then moves every host node
on the request's walk to the device in one step: the ones covering [D, H) are loaded (their
bytes cross the host link), the ones past the hit are the tokens the request computes anyway,
whose fresh device pages simply replace the host copy. The last one moves whole, also past
where the request leaves it: the admission and the eviction policy's learners then see the
request leave a cached sequence mid-edge, as they would without the tier (a cut at the walk's
end would show them a node end, and rewriting agents would look like chats). Its part past
the walk crosses the link and counts as loaded: a live tier, which plans on the match with
host nodes in it, would leave it on host, so the simulator overstates our transfers by that.
The walk and match are then redone on a path that is all on the device, so admission, locks
and insert run as without the tier.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from jenga_sglang.radix.host_copy import keep
from jenga_sglang.radix.match import MatchResult, Walk
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import Pages
from jenga_sglang.radix.rules import GroupRule, MambaRule, longest_common_valid
from jenga_sglang.radix.tokens import TokenSeq

if TYPE_CHECKING:
    from jenga_sglang.radix.cache import PrefixCache
    from jenga_sglang.radix.host import HostTier


class HostMambaRule(GroupRule):
    """Mamba's rule with host checkpoints: p is the end of a path node holding a checkpoint
    in either tier (or 0)."""

    def longest_valid(self, path: Sequence[Node], limit: int) -> int:
        for i in range(len(path) - 1, -1, -1):
            node = path[i]
            if node.end <= limit and (node.state is not None or node.host_state is not None):
                return node.end
        return 0


class Loaded(NamedTuple):
    """What the host tier gave one request."""

    host_hit: int  # tokens of the hit that were loaded from host memory (H - D)
    load_bytes: int  # bytes moved host -> device for it


def host_rules(rules: Sequence[GroupRule]) -> tuple[GroupRule, ...]:
    """The tree's rules with Mamba's accepting host checkpoints."""
    return tuple(HostMambaRule() if isinstance(rule, MambaRule) else rule for rule in rules)


def prepare(
    cache: PrefixCache,
    host: HostTier,
    seq: TokenSeq,
    walk: Walk,
    whole: int,
    namespace: str | None = None,
) -> tuple[Walk, MatchResult, Loaded] | None:
    """Make the request's walk of `seq` device-resident, loading its host hit if the tier
    policy says so; the new walk, the device match of its first `whole` tokens, and what was
    loaded. None when no node on the walk is in host memory and no host checkpoint ends a hit
    (nothing to do: the caller's walk and match stand)."""
    tree = cache.tree
    path = walk.path
    offered = offer(cache, host, walk, whole)
    if offered is None:
        return None
    device, hit, load_bytes = offered
    beyond = _bytes_past(host, path, walk.length)  # of the last node, moved whole
    if not _promote(cache, host, walk, hit):
        hit, load_bytes = device, 0
    else:
        load_bytes += beyond
        host.load_bytes += load_bytes
        host.past_bytes += beyond
    walk = tree.walk(seq, namespace=namespace)  # the request's namespace (radix/spaces.py)
    full = walk.prefix(whole)  # the input's walk: admission plans on where it leaves the tree
    assert tree.match_walk(full.prefix(hit)).length == hit, f"{hit} tokens not on the device"
    found = MatchResult(hit, tuple(n for n in full.path if n.start < hit), full)
    return walk, found, Loaded(hit - device, load_bytes)


def offer(
    cache: PrefixCache, host: HostTier, walk: Walk, whole: int
) -> tuple[int, int, int] | None:
    """What `prepare` would do for this walk, nothing moved: the device hit D, the hit H the
    request resumes from once loaded (D when the tier policy prefers recomputing [D, H)), and
    the bytes that load moves; None when no node on the walk is in host memory and no host
    checkpoint ends a hit."""
    path = walk.path
    if not any(n.host or n.host_state is not None for n in path):
        return None
    limit = min(whole, walk.length)
    hit = longest_common_valid(host.rules, path, limit)
    device = _device_hit(cache, path, limit)
    load_bytes = _load_bytes(host, path, device, hit)
    if hit > device:
        flops = cache.cost.flops
        after, without = flops(whole) - flops(hit), flops(whole) - flops(device)
        if not host.policy.loads(load_bytes, after, without):
            hit, load_bytes = device, 0
    return device, hit, load_bytes


def _device_hit(cache: PrefixCache, path: tuple[Node, ...], limit: int) -> int:
    """The hit the device alone holds: the path up to its first host node, device
    checkpoints only."""
    for i, node in enumerate(path):
        if node.host:
            path, limit = path[:i], min(limit, node.start)
            break
    return longest_common_valid(cache.tree.rules, path, limit)


def _load_bytes(host: HostTier, path: tuple[Node, ...], device: int, hit: int) -> int:
    """Bytes a load of [device, hit) moves: host KV of those positions, and the checkpoint
    at `hit` when it is in host memory."""
    tree, memory = host.tree, host.memory
    total = 0
    for node in path:
        if node.end == hit and node.host_state is not None and hit > device:
            assert tree.state_type is not None
            total += memory.page_bytes(tree.state_type)
        if not node.host or node.start >= hit or node.end <= device:
            continue
        for slot, ptype in enumerate(tree.kv_types):
            first = node.start + node.tombstones[slot]  # window groups: dropped pages lead
            pages = min(node.end, hit) - max(first, device)
            total += max(0, pages) * memory.page_bytes(ptype)
    return total


def _bytes_past(host: HostTier, path: tuple[Node, ...], end: int) -> int:
    """Host KV bytes of the path's last node past `end` (where the walk leaves it)."""
    if not path or not path[-1].host or path[-1].end <= end:
        return 0
    last, tree = path[-1], host.tree
    total = 0
    for slot, ptype in enumerate(tree.kv_types):
        first = last.start + last.tombstones[slot]  # window groups: dropped pages lead
        total += (last.end - max(first, end)) * host.memory.page_bytes(ptype)
    return total


def _promote(cache: PrefixCache, host: HostTier, walk: Walk, hit: int) -> bool:
    """Move every host node on `walk` to the device (the last one whole: module docstring),
    and the host checkpoint at `hit`; False, having dropped the host part of the walk
    instead, when the device cannot hold them. The device prefix is locked and the host nodes
    held (T3) while device pages are allocated, so the evictions that allocation causes take
    neither."""
    tree = cache.tree
    end_state = next((n for n in walk.path if n.end == hit and n.host_state is not None), None)
    nodes = [n for n in walk.path if n.host]  # a suffix of the path (T1)
    if not nodes and end_state is None:
        return True
    anchor = _deepest_device(walk.path)
    tree.lock(anchor)  # holds the device path, and its host checkpoints (tree.lock)
    for node in nodes:  # held for the transfer (T3): out of the host policy's reach
        node.lock_ref += 1
        host.policy.host.update(node)
    wants = [(t, sum(len(n.kv[slot]) for n in nodes)) for slot, t in enumerate(tree.kv_types)]
    if end_state is not None:
        assert tree.state_type is not None
        wants.append((tree.state_type, 1))
    pages = cache.memory.try_alloc_all(wants, 0)
    for node in nodes:
        node.lock_ref -= 1
    if pages is None:
        tree.unlock(anchor)
        if nodes:  # the walk's insert cannot pass host nodes: drop them (they would be
            host.drop_subtree(nodes[0])  # recomputed anyway)
        return False
    _move_down(host, nodes, pages[: len(tree.kv_types)])
    if end_state is not None:
        _load_state(host, end_state, pages[-1])
    tree.unlock(anchor)
    return True


def _deepest_device(path: tuple[Node, ...]) -> Node | None:
    """The node to lock while loading: the deepest device node of the path, the parent of
    its host part (None: the root). Locking it holds every device node above, the one whose
    host checkpoint is loaded included."""
    deepest: Node | None = None
    for node in path:
        if node.host:
            break
        deepest = node
    return deepest


def _move_down(host: HostTier, nodes: list[Node], runs: list[Pages]) -> None:
    """Give each host node (top-down) its share of the device runs and free its host pages;
    it moves to its parent's `children` (T1 holds after each: its parent is on the device)."""
    tree = host.tree
    for node in nodes:
        kept = list(node.kv)  # left in host memory, a clean copy (radix/host_copy.py)
        for slot, ptype in enumerate(tree.kv_types):
            own, runs[slot] = runs[slot].split(len(node.kv[slot]))
            if len(node.kv[slot]):
                if host.copies is not None:
                    host.copies.load(ptype, node.kv[slot], own)
                tree.memory.mark_evictable(ptype, own)
            node.kv[slot] = own
        parent = node.parent
        assert parent is not None and not parent.host
        head = node.key.head(0, tree.page)
        del parent.host_children[head]
        parent.children[head] = node
        node.host = False
        keep(host, node, kept, None)
        host.policy.host.update(node)  # a host checkpoint it keeps stays a host entry
        tree.policy.update(node)
        if parent is not tree.root:
            tree.policy.update(parent)


def _load_state(host: HostTier, node: Node, page: Pages) -> None:
    tree = host.tree
    state_type = tree.state_type
    assert state_type is not None and node.host_state is not None
    if host.copies is not None:
        host.copies.load(state_type, node.host_state, page)
    keep(host, node, None, node.host_state)
    node.host_state, node.state = None, page
    if node.lock_ref == 0:
        tree.memory.mark_evictable(state_type, page)
    host.policy.host.update(node)
    tree.policy.update(node)
