"""A host-memory tier under the radix tree: what device eviction demotes instead of dropping.

Design and invariants: docs/host-tier.md. In short, a node's KV is on the device or in host
memory (`Node.host`), its checkpoint in `state` (device) or `host_state` (host), and

* T1: the device part of the tree is closed upwards: host nodes hang only in `host_children`,
  and a host node has no device child;
* T2: a node holds `state` or `host_state`, never both; host nodes have no `state`, no `inner`;
* T3: `lock_ref` of a host node counts transfers in flight (radix/host_load.py), 0 otherwise;
* T4: per tier, free + evictable + used == total; every host page of the tree is evictable
  in host memory;
* T5: the device policy ranks device nodes only, the tier policy's `host` host entries only;
* T6: a device node's clean copy (radix/host_copy.py) is listed in `clean`, its pages
  evictable host memory that host eviction frees only when no host entry is left.

`HostTier` holds the host memory and the tier policy (radix/contracts.py `TierPolicy`), moves
victims down (`evict`, the device evictor's hook; the moves are radix/host_demote.py's),
evicts host entries when host memory is short (`evict_for`, host memory's evictor) and checks
T1-T6 (`check_host`). Loading back is in radix/host_load.py, what a load-back leaves on host
in radix/host_copy.py.

The tier decides and counts; the bytes behind a move are `HostCopies`' (the live server's,
jenga_sglang/binding/host/). The simulator has none: its pages are counts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from mypy_extensions import mypyc_attr

from jenga_sglang.radix.contracts import TierPolicy
from jenga_sglang.radix.host_copy import check_copies, discard, drop_copied_state, evict_oldest
from jenga_sglang.radix.host_demote import demote_leaf, demote_state
from jenga_sglang.radix.host_load import Loaded, host_rules, prepare
from jenga_sglang.radix.match import MatchResult, Walk
from jenga_sglang.radix.memory import CacheMemory, Evictor
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import Pages, PageType
from jenga_sglang.radix.spaces import forget_if_empty
from jenga_sglang.radix.tokens import TokenSeq

if TYPE_CHECKING:
    from jenga_sglang.radix.cache import PrefixCache
    from jenga_sglang.radix.tree import RadixTree


@mypyc_attr(allow_interpreted_subclasses=True)
class HostCopies(ABC):
    """The bytes of the tier's moves: called with both sides' pages while both are held, so
    the source is still intact and the destination already owned (each move's pages, in the
    same order on both sides)."""

    @abstractmethod
    def store(self, ptype: PageType, device: Pages, host: Pages) -> None:
        """Copy device pages into the host pages allocated for them (a demotion)."""

    @abstractmethod
    def load(self, ptype: PageType, host: Pages, device: Pages) -> None:
        """Copy host pages into the device pages allocated for them (a load-back)."""

    @abstractmethod
    def kept(self, ptype: PageType, device: Pages, host: Pages) -> None:
        """A demotion whose bytes the host pages still hold since the node's load-back
        (radix/host_copy.py): nothing to copy, the device pages go next."""


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class HostTier(Evictor):
    """The host tier of one tree: its memory, its policy, the moves between tiers, counters."""

    def __init__(
        self,
        tree: RadixTree,
        memory: CacheMemory,
        policy: TierPolicy,
        copies: HostCopies | None = None,
    ) -> None:
        if tree.host is not None:
            raise ValueError("the tree already has a host tier")
        self.tree = tree
        self.memory = memory
        self.policy = policy
        self.copies = copies
        self.rules = host_rules(tree.rules)  # hit rules with host KV and checkpoints
        memory.set_evictor(self)
        tree.host = self
        self.demoted_nodes = 0  # device leaves moved to host
        self.demoted_states = 0  # inner checkpoints moved to host
        self.dropped_nodes = 0  # host nodes evicted from host memory
        self.dropped_states = 0  # host checkpoints evicted from host memory
        self.write_bytes = 0  # device -> host, cumulative
        self.kept_bytes = 0  # demoted without a write: a clean copy held them (host_copy.py)
        self.clean: dict[Node, None] = {}  # device nodes with a clean copy, oldest first
        self.load_bytes = 0  # host -> device, cumulative
        # of which: the parts of nodes moved whole past where a request left them
        # (radix/host_load.py), which a live tier would leave on host
        self.past_bytes = 0

    def prepare(
        self,
        cache: PrefixCache,
        seq: TokenSeq,
        walk: Walk,
        whole: int,
        namespace: str | None = None,
    ) -> tuple[Walk, MatchResult, Loaded] | None:
        """Before admission: load the request's host hit and move its walk (in `namespace`,
        radix/spaces.py) to the device (radix/host_load.py `prepare`)."""
        return prepare(cache, self, seq, walk, whole, namespace)

    # ------------------------------------------------------------------ device eviction

    def evict(self, victim: Node) -> bool:
        """The device policy's victim: move it to host if the tier policy says so and host
        memory takes it (True); else prepare it to be dropped (its host descendants and host
        checkpoint go with a leaf) and return False."""
        if victim.children:  # an inner node: only its checkpoint is evicted
            if self.policy.demotes(victim, True) and demote_state(self, victim):
                return True
            drop_copied_state(self, victim)  # its checkpoint goes (a merge: its copy too)
            return False
        if self.policy.demotes(victim, False) and demote_leaf(self, victim):
            return True
        self.drop_below(victim)
        return False

    def drop_below(self, node: Node) -> None:
        """Free what `node` has in host memory: its clean copy, its host checkpoint and every
        host node below it (their prefix is about to go from the device)."""
        discard(self, node)
        if node.host_state is not None:
            self.drop_host_state(node)
        for child in list(node.host_children.values()):
            self.drop_subtree(child)

    def clear_walk(self, walk: Walk) -> bool:
        """Drop the host nodes on `walk` (a suffix of it, T1) and what hangs below them: a
        live request inserting along it brings its own pages for those tokens
        (binding/host/tier.py). Whether there were any."""
        first = next((n for n in walk.path if n.host), None)
        if first is None:
            return False
        self.drop_subtree(first)
        return True

    def drop_subtree(self, top: Node) -> None:
        """Remove the host node `top` and everything below it from the tree and host memory."""
        stack = [top]
        while stack:
            node = stack.pop()
            if node.lock_ref:
                raise AssertionError(f"dropping {node!r}: a transfer holds it")
            stack.extend(node.host_children.values())
            self._free_host_pages(node)
            self.policy.host.remove(node)
            self.dropped_nodes += 1
        parent = top.parent
        assert parent is not None
        del parent.host_children[top.key.head(0, self.tree.page)]
        top.parent = None
        if parent.parent is None:
            forget_if_empty(self.tree, parent)  # a namespace's last node (radix/spaces.py)

    def _free_host_pages(self, node: Node) -> None:
        for slot, ptype in enumerate(self.tree.kv_types):
            if len(node.kv[slot]):
                self.memory.free_evictable(ptype, node.kv[slot])
        if node.host_state is not None:
            assert self.tree.state_type is not None
            self.memory.free_evictable(self.tree.state_type, node.host_state)
            self.dropped_states += 1
            node.host_state = None

    def drop_host_state(self, node: Node) -> None:
        """Free `node`'s host checkpoint (evicted, or replaced by a fresh device one)."""
        state = node.host_state
        assert state is not None and self.tree.state_type is not None
        self.memory.free_evictable(self.tree.state_type, state)
        node.host_state = None
        self.dropped_states += 1
        self.policy.host.update(node)

    # ------------------------------------------------------------------ host eviction

    def evict_for(self, ptype: PageType) -> bool:
        """Host memory's evictor: evict the host policy's next victim (a host leaf whole, or
        a host checkpoint), or with none left the oldest clean copy (radix/host_copy.py).
        Host nodes are not merged afterwards: they stay valid as they are."""
        victim = self.policy.host.victim()
        if victim is None:
            return evict_oldest(self)
        if victim.host and not victim.host_children:
            parent = victim.parent
            self.drop_subtree(victim)
            if parent is not None and parent is not self.tree.root:
                self.policy.host.update(parent)
        else:
            self.drop_host_state(victim)
        return True

    # ------------------------------------------------------------------ integrity

    def host_nodes(self) -> list[Node]:
        """Every node whose KV is in host memory."""
        out: list[Node] = []
        stack = [self.tree.root, *self.tree.spaces.values()]  # every namespace's (spaces.py)
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for child in node.host_children.values():
                out.append(child)
                stack.append(child)
        return out

    def check_host(self) -> None:
        """Assert T1-T4 and T6 (module docstring) over the whole tree and host memory."""
        tree = self.tree
        held = dict.fromkeys(self.memory.page_types, 0)
        device = [tree.root, *tree.nodes()]
        for ptype, pages in check_copies(self, device):  # T6
            held[ptype] += len(pages)
        for node in device:  # device nodes: T1, T2
            assert not node.host, f"{node!r} is in `children` but on the host"
            assert node.state is None or node.host_state is None, f"{node!r}: two checkpoints"
            if node.host_state is not None:
                assert tree.state_type is not None
                held[tree.state_type] += len(node.host_state)
        for node in self.host_nodes():
            _check_host_node(tree, node)
            for slot, ptype in enumerate(tree.kv_types):
                held[ptype] += len(node.kv[slot])
            if node.host_state is not None and node.parent is not None:
                assert tree.state_type is not None
                held[tree.state_type] += len(node.host_state)
        for ptype, count in held.items():
            usage = self.memory.usage(ptype)
            assert usage.evictable == count, (
                f"host {ptype}: memory has {usage.evictable} evictable pages, the tree holds "
                f"{count} there"
            )
            assert usage.used == 0, f"host {ptype}: {usage.used} pages in flight between requests"
        self.memory.check_integrity()


def _check_host_node(tree: RadixTree, node: Node) -> None:
    parent = node.parent
    assert parent is not None, f"{node!r} is detached"
    assert node.host, f"{node!r} is in `host_children` but not on the host"
    assert parent.host_children.get(node.key.head(0, tree.page)) is node, f"{node!r} not linked"
    assert node.key.head(0, tree.page) not in parent.children, f"{node!r} linked twice"
    assert not node.children, f"{node!r}: a host node with device children (T1)"
    assert node.state is None and not node.inner, f"{node!r}: device state on a host node"
    assert node.lock_ref == 0, f"{node!r}: host node held between requests (T3)"
    assert len(node.key) > 0 and len(node.key) % tree.page == 0, f"{node!r}: bad key"
    assert node.start == parent.end and node.end == node.start + len(node.key), f"{node!r} span"
    for slot, group in enumerate(tree.attention):
        tomb = node.tombstones[slot]
        assert len(node.kv[slot]) + tomb == len(node.key), f"{node!r} group {slot} pages"
        assert group.window is not None or tomb == 0, f"{node!r}: tombstone in full group"
