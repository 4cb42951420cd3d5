"""The heterogeneous radix tree: one tree over token ids for every layer group of a model.

Each node holds the KV pages of its edge for every attention group and at most one SSM
checkpoint valid at its end (see node.py). The tree is framework-free: pages come from a
`CacheMemory`, victims from an `EvictionPolicy` (contracts.py), hit rules from the model spec
(rules.py). This module holds the tree's state, its walk and match, its locks and the split
every change of shape goes through; what adds to it is in insert.py, what takes from it in
evict.py, and the check of the invariants below in integrity.py.

Pages (`page` tokens each, 1 by default): a server whose KV allocator hands out pages of
several tokens can share only whole pages, as SGLang's own cache does with --page-size > 1.
The walk then counts only whole pages in common, so every node boundary, hit, split and
checkpoint lies on a page boundary and no page is ever held by two nodes; inserted keys must
be whole pages.

Namespaces (spaces.py): requests of different namespaces (LoRA adapters, cache salts) never
share a prefix. Each named namespace is a root of its own beside `root` (the default
namespace), so look-ups and inserts take a `namespace` (None: the default one) and start at
its root; everything below a root, and eviction over all of them, is namespace-blind.

Invariants (checked by `check_integrity`, in integrity.py):
* links: every child is keyed by its first page, `start == parent.end`,
  `end == start + len(key)`, keys non-empty and, with pages of several tokens, whole pages;
* locks: lock_ref(n) = own locks(n) + sum of lock_ref over its children, with own locks >= 0;
* pages: per attention group, len(kv[g]) + tombstones[g] == len(key) (full groups: no tombstones);
  a state is one page; no page id is held by two nodes;
* conservation: per page type, the pages of unlocked nodes are exactly the memory's evictable
  pages, and the memory itself satisfies free + evictable + used == total.

With a host-memory tier (radix/host.py) these hold for the device nodes (`children`); the host
nodes (`host_children`) and host memory obey the tier's T1-T6, checked there.

Runs (node.py): when the eviction policy ranks a chain of nodes inserted together as one node
(`EvictionPolicy.evicts_runs`: LRU), a new leaf's checkpoints become its `inner` checkpoints
instead of a chain of nodes, which spares creating and evicting a node per checkpoint
(vllm-blocks: one every 32 tokens). The tree cuts a run wherever the chain's nodes could be
told apart, so it makes the chain's decisions:
* `walk` cuts each run it enters at every inner checkpoint up to where it stops and at the
  first one past it: hits, branch points, refreshes, locks and inserts meet the chain's nodes;
* eviction takes a leaf run's last segment, [its last inner checkpoint, end), which is the
  chain's leaf, and counts it as an evicted node.
Node ids may differ from the chain's. LRU reads them only to break a tie between two leaves of
equal recency, and there is none: everything one request touches lies on one root path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from mypy_extensions import mypyc_attr

from jenga_sglang.models.spec import AttentionGroup, ModelSpec
from jenga_sglang.radix.contracts import EvictionPolicy
from jenga_sglang.radix.evict import drop_state, evict_for, evict_leaf
from jenga_sglang.radix.host_copy import split as split_copy
from jenga_sglang.radix.insert import chain_below, insert
from jenga_sglang.radix.integrity import check_tree
from jenga_sglang.radix.match import MatchResult, Walk
from jenga_sglang.radix.memory import CacheMemory, Evictor
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import PageKind, Pages, PageType
from jenga_sglang.radix.rules import (
    FullAttentionRule,
    GroupRule,
    MambaRule,
    SlidingWindowRule,
    longest_common_valid,
)
from jenga_sglang.radix.spaces import every_node, new_root
from jenga_sglang.radix.tokens import TokenSeq

if TYPE_CHECKING:
    from jenga_sglang.radix.host import HostTier


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class RadixTree(Evictor):
    """Token radix tree with per-group pages, SSM checkpoints, locks and policy-driven eviction."""

    def __init__(
        self, spec: ModelSpec, memory: CacheMemory, policy: EvictionPolicy, page: int = 1
    ) -> None:
        if page < 1:
            raise ValueError(f"page size must be >= 1 token, got {page}")
        self.spec = spec
        self.page = page
        self.memory = memory
        self.policy = policy
        self.attention: tuple[AttentionGroup, ...] = spec.attention_groups
        self.kv_types = tuple(PageType(PageKind.KV, spec.groups.index(g)) for g in self.attention)
        mamba = spec.mamba_groups
        self.state_type = PageType(PageKind.STATE, spec.groups.index(mamba[0])) if mamba else None
        self.rules: tuple[GroupRule, ...] = self._build_rules()
        self.keeps_runs = policy.evicts_runs
        self._next_id = 1
        self.root = new_root(self, 0)  # the default namespace's
        self.spaces: dict[str, Node] = {}  # the named namespaces' roots (spaces.py)
        self.space_names: dict[int, str] = {}  # a named root's id -> its namespace
        memory.set_evictor(self)
        self.evicted_nodes = 0
        self.evicted_states = 0
        self.host: HostTier | None = None  # a host-memory tier (radix/host.py), if attached

    def _build_rules(self) -> tuple[GroupRule, ...]:
        rules: list[GroupRule] = []
        for slot, group in enumerate(self.attention):
            if group.window is None:
                rules.append(FullAttentionRule())
            else:
                rules.append(SlidingWindowRule(group.window, slot))
        if self.state_type is not None and self.spec.keeps_states:
            rules.append(MambaRule())  # states sent by a peer (a PD decode worker's): no rule
        return tuple(rules)

    # ------------------------------------------------------------------ look-ups

    def top(self, namespace: str | None) -> Node | None:
        """The root of `namespace` (None: the default one, `root`); None when it holds nothing."""
        return self.root if namespace is None else self.spaces.get(namespace)

    def walk(self, key: TokenSeq, start: Node | None = None, namespace: str | None = None) -> Walk:
        """How many leading tokens of `key` the tree holds in `namespace`, ignoring hit rules.
        Nothing changes but the shape: runs along the way are cut into their chain's nodes
        (Runs, above).

        `start`: a node known to hold `key`'s first `start.end` tokens, no run, on a path no
        walk would cut (a request's locked node: its match walked there, and locked nodes are
        never merged into runs). The walk compares tokens only below it, so a request's later
        inserts do not compare its long cached prefix again (`namespace` is then the one
        `start` lies in, or None)."""
        top = self.root if namespace is None else self.spaces.get(namespace)
        if top is None:
            return Walk(0, ())  # a namespace with nothing cached
        node, pos, path, size = top, 0, [], len(key)
        if start is not None and start is not top:
            if start.inner or start.end > size or start.lock_ref <= 0:
                raise ValueError(f"walk from {start!r}: not a locked node on the key's path")
            node, pos, path = start, start.end, start.path_from_root()
        page = self.page
        while pos < size:
            head = key.head(pos, page)
            child = node.children.get(head)
            if child is None:
                # a child whose KV is in host memory (radix/host.py): the walk goes on there
                child = node.host_children.get(head) if node.host_children else None
                if child is None:
                    break
            common = child.key.common_prefix(key, pos)
            pos += common - common % page  # whole pages: at least one, as the head matched
            if child.inner:
                path.extend(self._cut_run(child, pos))
                child = path[-1]
            else:
                path.append(child)
            if pos < child.end:
                break
            node = child
        return Walk(pos, tuple(path))

    def _cut_run(self, run: Node, stop: int) -> list[Node]:
        """Cut the chain's nodes out of `run` from its start down to the one holding the token
        before `stop` (where a walk stops); returns them top-down. `run` keeps the rest, and is
        the last of them when it holds that token itself."""
        inner = run.inner
        cuts = [at for at, _ in inner[: _below(inner, stop) + 1]]  # and the first past `stop`
        chain = [self.split(run, at - run.start) for at in cuts]
        if run.start < stop:
            chain.append(run)
        return chain

    def match(self, key: TokenSeq, namespace: str | None = None) -> MatchResult:
        """Longest prefix of `key` in `namespace` valid for every layer group (no side effects
        but `walk`'s)."""
        return self.match_walk(self.walk(key, namespace=namespace))

    def match_walk(self, walk: Walk) -> MatchResult:
        """`match` for a key already walked."""
        length = longest_common_valid(self.rules, walk.path, walk.length)
        path = tuple(n for n in walk.path if n.start < length)
        return MatchResult(length, path, walk)

    def touch(self, result: MatchResult, now: int, ahead: Walk | None = None) -> None:
        """Record a look-up: the policy sees where it left the tree and refreshes recency; the
        deepest node counts the hit. `ahead`: the walk of input + output, when known."""
        self.policy.observe(result.walk)
        if result.path:
            result.path[-1].hit_count += 1
            self.policy.refresh(result.path, now)
        if ahead is not None:
            self.policy.passing(ahead, now)

    # ------------------------------------------------------------------ locks

    def lock(self, node: Node | None) -> None:
        """Protect `node` and its ancestors from eviction until `unlock` (its namespace's root,
        like the tree's, is never evicted: the walk up stops below it)."""
        current = node
        while current is not None and current.parent is not None:
            current.lock_ref += 1
            if current.lock_ref == 1:
                self._set_pages_used(current, used=True)
                self.policy.update(current)
                if current.host_state is not None:
                    self._host_update(current)
            current = current.parent

    def unlock(self, node: Node | None) -> None:
        if node is None or node is self.root:
            return
        if node.lock_ref <= 0:
            raise ValueError(f"unlock of {node!r}: it is not locked (lock_ref would go negative)")
        if node.parent is None and node is not self.root:
            raise ValueError(f"unlock of {node!r}: it is no longer in the tree")
        current: Node | None = node
        while current is not None and current.parent is not None:
            current.lock_ref -= 1
            if current.lock_ref == 0:
                self._set_pages_used(current, used=False)
                self.policy.update(current)
                if current.host_state is not None:
                    self._host_update(current)
            current = current.parent

    def _host_update(self, node: Node) -> None:
        """A node with a host checkpoint was locked or unlocked: a running request's path
        keeps its host checkpoints (radix/host.py)."""
        assert self.host is not None
        self.host.policy.host.update(node)

    # Loops over attention groups index `node.kv` rather than zip it with `kv_types`: compiled
    # (scripts/build_compiled.py), zip(..., strict=True) is a generic call, several times slower.

    def _set_pages_used(self, node: Node, used: bool) -> None:
        for slot, ptype in enumerate(self.kv_types):
            if len(node.kv[slot]):
                _mark(self.memory, ptype, node.kv[slot], used)
        if node.state is not None:
            assert self.state_type is not None
            _mark(self.memory, self.state_type, node.state, used)
        for _, state in node.inner:
            assert self.state_type is not None
            _mark(self.memory, self.state_type, state, used)

    # ------------------------------------------------------------------ insert (insert.py)

    def insert(
        self,
        key: TokenSeq,
        start: int,
        kv: list[Pages],
        states: dict[int, Pages],
        now: int,
        walk: Walk | None = None,
        namespace: str | None = None,
    ) -> Node:
        """Cache `key` in `namespace`, the caller's pages for [start, len(key)) and its
        checkpoints; the node ending at len(key) (radix/insert.py `insert`)."""
        return insert(self, key, start, kv, states, now, walk, namespace)

    def chain_below(self, key: TokenSeq, at: int, namespace: str | None = None) -> list[Node]:
        """The nodes holding only `key`'s tokens [at, len(key)) (radix/insert.py)."""
        return chain_below(self, key, at, namespace)

    # ------------------------------------------------------------------ shape

    def split(self, node: Node, at: int) -> Node:
        """Cut `node`'s edge after `at` tokens; returns the new upper node.

        The SSM checkpoint stays with `node`: it is valid at node.end, which does not move. A
        run's inner checkpoints go with the part they lie in; one at the cut becomes upper's.
        """
        assert node.parent is not None and 0 < at < len(node.key)
        upper_kv: list[Pages] = []
        upper_tomb: list[int] = []
        for slot, pages in enumerate(node.kv):
            tomb = node.tombstones[slot]
            upper_tomb.append(min(tomb, at))
            head, tail = pages.split(at - upper_tomb[-1])
            upper_kv.append(head)
            node.kv[slot] = tail
            node.set_tombstone(slot, max(0, tomb - at))
        upper = Node(
            self.new_id(),
            node.key.slice(0, at),
            node.parent,
            upper_kv,
            upper_tomb,
            node.last_access,
        )
        upper.lock_ref = node.lock_ref
        # hits counted on `node` resumed from its end, which stays below the cut: the upper part
        # was never resumed from (an inherited count made it look superseded, a state dropped
        # first, as soon as a request split it)
        if node.inner:
            _share_inner(upper, node)
        # a host node's halves stay in host memory, linked and ranked there (radix/host.py)
        upper.host = node.host
        siblings = node.parent.host_children if node.host else node.parent.children
        siblings[upper.key.head(0, self.page)] = upper
        node.key = node.key.slice(at)
        node.parent = upper
        node.start = upper.end
        below = upper.host_children if node.host else upper.children
        below[node.key.head(0, self.page)] = node
        if node.host_copy is not None:  # a device node's clean copy splits with it
            assert self.host is not None
            split_copy(self.host, upper, node)
        policy = self.policy
        if node.host:
            assert self.host is not None
            policy = self.host.policy.host
        policy.update(upper)
        policy.update(node)
        return upper

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    # ------------------------------------------------------------------ eviction (evict.py)

    def evict_for(self, ptype: PageType) -> bool:
        """Evictor callback of the memory: evict the policy's next victim."""
        return evict_for(self, ptype)

    def evict_leaf(self, node: Node) -> None:
        """Free everything an unlocked leaf holds and remove it (a run: all its segments)."""
        evict_leaf(self, node)

    def drop_state(self, node: Node) -> None:
        """Evict an inner node's checkpoint, keeping its KV (radix/evict.py)."""
        drop_state(self, node)

    # ------------------------------------------------------------------ integrity

    def nodes(self) -> Iterator[Node]:
        """Every node but the roots, of every namespace."""
        if self.spaces:
            return every_node(self)
        it = self.root.subtree()
        next(it)
        return it

    def check_integrity(self) -> None:
        """Assert the invariants in the module docstring (radix/integrity.py)."""
        check_tree(self)


def _mark(memory: CacheMemory, ptype: PageType, pages: Pages, used: bool) -> None:
    """Move `pages` to used or to evictable (a direct call, unlike a bound method's)."""
    if used:
        memory.mark_used(ptype, pages)
    else:
        memory.mark_evictable(ptype, pages)


def _share_inner(upper: Node, lower: Node) -> None:
    """Split `lower`'s inner checkpoints at upper's end, where `_split` just cut it."""
    inner, cut = lower.inner, upper.end
    above = _below(inner, cut)
    upper.inner = inner[:above]
    if above < len(inner) and inner[above][0] == cut:
        upper.state = inner[above][1]
        above += 1
    lower.inner = inner[above:]


def _below(inner: tuple[tuple[int, Pages], ...], pos: int) -> int:
    """How many of a run's inner checkpoints lie before `pos`."""
    count = 0
    while count < len(inner) and inner[count][0] < pos:
        count += 1
    return count
