"""The heterogeneous radix tree: one tree over token ids for every layer group of a model.

Each node holds the KV pages of its edge for every attention group and at most one SSM
checkpoint valid at its end (see node.py). The tree is framework-free: pages come from a
`CacheMemory`, victims from an `EvictionPolicy`, hit rules from the model spec (rules.py).

Invariants (checked by `check_integrity`, in integrity.py):
* links: every child is keyed by its first token, `start == parent.end`,
  `end == start + len(key)`, keys non-empty;
* locks: lock_ref(n) = own locks(n) + sum of lock_ref over its children, with own locks >= 0;
* pages: per attention group, len(kv[g]) + tombstones[g] == len(key) (full groups: no tombstones);
  a state is one page; no page id is held by two nodes;
* conservation: per page type, the pages of unlocked nodes are exactly the memory's evictable
  pages, and the memory itself satisfies free + evictable + used == total.

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

from mypy_extensions import mypyc_attr

from jenga_sglang.models.spec import AttentionGroup, ModelSpec
from jenga_sglang.radix.contracts import EvictionPolicy
from jenga_sglang.radix.integrity import check_tree
from jenga_sglang.radix.match import MatchResult, Walk
from jenga_sglang.radix.memory import CacheMemory, Evictor
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import IdPages, PageKind, Pages, PageType
from jenga_sglang.radix.rules import (
    FullAttentionRule,
    GroupRule,
    MambaRule,
    SlidingWindowRule,
    longest_common_valid,
)
from jenga_sglang.radix.tokens import TokenSeq


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class RadixTree(Evictor):
    """Token radix tree with per-group pages, SSM checkpoints, locks and policy-driven eviction."""

    def __init__(self, spec: ModelSpec, memory: CacheMemory, policy: EvictionPolicy) -> None:
        self.spec = spec
        self.memory = memory
        self.policy = policy
        self.attention: tuple[AttentionGroup, ...] = spec.attention_groups
        self.kv_types = tuple(PageType(PageKind.KV, spec.groups.index(g)) for g in self.attention)
        mamba = spec.mamba_groups
        self.state_type = PageType(PageKind.STATE, spec.groups.index(mamba[0])) if mamba else None
        self.rules: tuple[GroupRule, ...] = self._build_rules()
        self.keeps_runs = policy.evicts_runs
        self._next_id = 1
        self.root = Node(
            0,
            TokenSeq(b""),
            None,
            [IdPages([]) for _ in self.attention],
            [0] * len(self.attention),
            now=0,
        )
        self.root.lock_ref = 1  # the root is never evicted
        memory.set_evictor(self)
        self.evicted_nodes = 0
        self.evicted_states = 0

    def _build_rules(self) -> tuple[GroupRule, ...]:
        rules: list[GroupRule] = []
        for slot, group in enumerate(self.attention):
            if group.window is None:
                rules.append(FullAttentionRule())
            else:
                rules.append(SlidingWindowRule(group.window, slot))
        if self.state_type is not None:
            rules.append(MambaRule())
        return tuple(rules)

    # ------------------------------------------------------------------ look-ups

    def walk(self, key: TokenSeq, start: Node | None = None) -> Walk:
        """How many leading tokens of `key` the tree holds, ignoring hit rules. Nothing changes
        but the shape: runs along the way are cut into their chain's nodes (Runs, above).

        `start`: a node known to hold `key`'s first `start.end` tokens, no run, on a path no
        walk would cut (a request's locked node: its match walked there, and locked nodes are
        never merged into runs). The walk compares tokens only below it, so a request's later
        inserts do not compare its long cached prefix again."""
        node, pos, path, size = self.root, 0, [], len(key)
        if start is not None and start is not self.root:
            if start.inner or start.end > size or start.lock_ref <= 0:
                raise ValueError(f"walk from {start!r}: not a locked node on the key's path")
            node, pos, path = start, start.end, start.path_from_root()
        while pos < size:
            child = node.children.get(key.head(pos))
            if child is None:
                break
            pos += child.key.common_prefix(key, pos)
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
        chain = [self._split(run, at - run.start) for at in cuts]
        if run.start < stop:
            chain.append(run)
        return chain

    def match(self, key: TokenSeq) -> MatchResult:
        """Longest prefix of `key` valid for every layer group (no side effects but `walk`'s)."""
        return self.match_walk(self.walk(key))

    def match_walk(self, walk: Walk) -> MatchResult:
        """`match` for a key already walked."""
        length = longest_common_valid(self.rules, walk.path, walk.length)
        path = tuple(n for n in walk.path if n.start < length)
        return MatchResult(length, path, walk)

    def touch(self, result: MatchResult, now: int) -> None:
        """Record a look-up: the policy sees where it left the tree and refreshes recency; the
        deepest node counts the hit."""
        self.policy.observe(result.walk)
        if result.path:
            result.path[-1].hit_count += 1
            self.policy.refresh(result.path, now)

    # ------------------------------------------------------------------ locks

    def lock(self, node: Node | None) -> None:
        """Protect `node` and its ancestors from eviction until `unlock`."""
        current = node
        while current is not None and current is not self.root:
            current.lock_ref += 1
            if current.lock_ref == 1:
                self._set_pages_used(current, used=True)
                self.policy.update(current)
            current = current.parent

    def unlock(self, node: Node | None) -> None:
        if node is None or node is self.root:
            return
        if node.lock_ref <= 0:
            raise ValueError(f"unlock of {node!r}: it is not locked (lock_ref would go negative)")
        if node.parent is None and node is not self.root:
            raise ValueError(f"unlock of {node!r}: it is no longer in the tree")
        current: Node | None = node
        while current is not None and current is not self.root:
            current.lock_ref -= 1
            if current.lock_ref == 0:
                self._set_pages_used(current, used=False)
                self.policy.update(current)
            current = current.parent

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

    # ------------------------------------------------------------------ insert

    def insert(
        self,
        key: TokenSeq,
        start: int,
        kv: list[Pages],
        states: dict[int, Pages],
        now: int,
        walk: Walk | None = None,
    ) -> Node:
        """Cache `key`. The caller hands over pages it owns (used pages):

            key:  [0 ........ start) [start .................... len(key))
                   pages borrowed     kv[g]: the caller's pages (sliding-window groups may
                   from the tree      have dropped a leading run: tombstones)

        Positions the tree already holds are kept and the caller's duplicates freed; new
        positions become a new leaf. `states` maps exact positions p in (0, len(key)] to a
        one-page SSM checkpoint valid after tokens [0, p): the tree splits a node so that one
        ends at p (the state stays with the node whose end it represents). Returns the node
        ending at len(key). Bad input raises ValueError before anything changes.

        `walk` may pass `self.walk(key)` when the caller has it (the tree must not have changed
        along its path since: e.g. its last node was locked meanwhile).
        """
        self._validate_insert(key, start, kv, states)
        if walk is None:
            walk = self.walk(key)
        if walk.length < start:
            raise ValueError(
                f"insert claims {start} cached tokens but the tree holds only {walk.length} "
                "(lock the matched prefix while computing the rest)"
            )
        node = self._node_ending_at(walk)
        kv = self._free_duplicates(key, start, walk.length, kv)
        held = {p: st for p, st in states.items() if p <= walk.length}
        if walk.length < len(key):
            if self._can_grow(node, kv):
                self._grow_leaf(node, key.slice(walk.length), kv, now)
                held = dict(states)  # the grown leaf is split at its checkpoints below
            else:
                new = {p - walk.length: st for p, st in states.items() if p > walk.length}
                node = self._add_leaf(node, key.slice(walk.length), kv, now, new)
        self._attach_states(key, held, now)
        return node

    def _validate_insert(
        self, key: TokenSeq, start: int, kv: list[Pages], states: dict[int, Pages]
    ) -> None:
        if not isinstance(key, TokenSeq):
            raise ValueError(f"insert key must be a TokenSeq, got {type(key).__name__}")
        size = len(key)
        if size == 0:
            raise ValueError("insert of an empty key")
        if not 0 <= start <= size:
            raise ValueError(f"start {start} outside [0, {size}]")
        if len(kv) != len(self.attention):
            raise ValueError(
                f"expected pages for {len(self.attention)} attention groups, got {len(kv)}"
            )
        span = size - start
        for slot, group in enumerate(self.attention):
            count = len(kv[slot])
            if count > span or (group.window is None and count < span):
                raise ValueError(f"group {group.name}: {count} pages for {span} new tokens")
        for pos, state in states.items():
            if self.state_type is None:
                raise ValueError("states given but the model has no Mamba group")
            if not 0 < pos <= size:
                raise ValueError(f"checkpoint position {pos} outside (0, {size}]")
            if len(state) != 1:
                raise ValueError(f"a checkpoint is one state page, got {len(state)}")

    def _node_ending_at(self, walk: Walk) -> Node:
        """The node ending exactly where `walk` stops, splitting its last node if needed."""
        if not walk.path:
            return self.root
        last = walk.path[-1]
        if last.end > walk.length:
            return self._split(last, walk.length - last.start)
        return last

    def _descend_splitting(
        self, key: TokenSeq, length: int, node: Node | None = None, pos: int = 0
    ) -> Node:
        """The node ending exactly at `length` along `key` (which the tree holds), splitting.

        Starts from `node`, which ends at `pos` on the same path (the root by default).
        """
        node = self.root if node is None else node
        while pos < length:
            child = node.children[key.head(pos)]
            if pos + len(child.key) > length:
                child = self._split(child, length - pos)
            node, pos = child, pos + len(child.key)
        return node

    def chain_below(self, key: TokenSeq, at: int) -> list[Node]:
        """The nodes holding `key`'s tokens [at, len(key)), top-down, when nothing else passes
        there (each has one child, the last is a leaf ending at len(key)); else []. The node
        holding position `at` is split so that a node starts exactly there. The tree must
        hold all of `key` (it was just inserted)."""
        if not 0 < at < len(key):
            return []
        node = self._descend_splitting(key, at)
        chain: list[Node] = []
        while node.end < len(key):
            if chain and len(node.children) != 1:
                return []
            node = node.children[key.head(node.end)]
            chain.append(node)
        return chain if chain and not chain[-1].children else []

    def _attach_states(self, key: TokenSeq, states: dict[int, Pages], now: int) -> None:
        """Attach checkpoints in one walk down the path (positions ascending)."""
        node, pos = self.root, 0
        for at in sorted(states):
            node = self._descend_splitting(key, at, node, pos)
            pos = at
            self._attach_state(node, states[at], now)

    def _free_duplicates(
        self, key: TokenSeq, start: int, present: int, kv: list[Pages]
    ) -> list[Pages]:
        """Free the caller's pages for [start, present) and return those for [present, end)."""
        span = len(key) - start
        dup = present - start
        rest: list[Pages] = []
        for slot, ptype in enumerate(self.kv_types):
            pages = kv[slot]
            dropped = span - len(pages)  # sliding-window tombstones lead the span
            cut = max(0, dup - dropped)
            head, tail = pages.split(cut)
            if len(head):
                self.memory.free(ptype, head)
            rest.append(tail)
        return rest

    def _add_leaf(
        self,
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
        if self.keeps_runs and cuts:
            inner = tuple((parent.end + at, states[at]) for at in cuts)
            cuts = []
        for slot, ptype in enumerate(self.kv_types):
            if len(kv[slot]):
                self.memory.mark_evictable(ptype, kv[slot])
        leaf_id = self._new_id()
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
            upper = Node(self._new_id(), key.slice(pos, cut), node, upper_kv, upper_tomb, now)
            node.children[key.head(pos)] = upper
            chain.append(upper)
            node, pos = upper, cut
        leaf = Node(leaf_id, key.slice(pos), node, kv, tombstones, now)
        node.children[key.head(pos)] = leaf
        chain.append(leaf)
        leaf.inner = inner
        for _, checkpoint in inner:
            assert self.state_type is not None
            self.memory.mark_evictable(self.state_type, checkpoint)
        for created in chain:
            state = states.get(created.end - parent.end)
            if state is not None:
                # `_attach_state` on a fresh, unlocked node without a state: no checks needed
                assert self.state_type is not None
                created.state = state
                self.memory.mark_evictable(self.state_type, state)
            self.policy.update(created)
        if parent is not self.root:
            self.policy.update(parent)
        return leaf

    def _can_grow(self, node: Node, kv: list[Pages]) -> bool:
        """Whether new tokens after `node` extend its edge instead of hanging a child on it.

        With a Mamba group a hit ends only at a checkpoint, so the end of a leaf without one
        is no reuse point: it exists only because the tokens arrived in two inserts (SGLang
        checkpoints a running request's prefill, then inserts its decode when it finishes).
        Growing the leaf keeps the tree what one insert of the whole sequence would build, so
        eviction weighs the same nodes whichever driver filled it. Not with sliding-window
        tombstones in the new pages (a node's tombstones must lead its edge).
        """
        return (
            self.state_type is not None
            and node is not self.root
            and node.is_leaf
            and node.state is None
            and all(t == 0 for t in node.tombstones)
            and all(len(pages) == len(kv[0]) for pages in kv)
        )

    def _grow_leaf(self, node: Node, key: TokenSeq, kv: list[Pages], now: int) -> None:
        """Append `key` and its pages (the caller's, used) to the stateless leaf `node`."""
        if len(kv[0]) != len(key):
            raise AssertionError(f"growing {node!r} by {len(key)} tokens with {len(kv[0])} pages")
        for slot, ptype in enumerate(self.kv_types):
            pages = kv[slot]
            node.kv[slot] = node.kv[slot].concat(pages)
            if node.lock_ref == 0 and len(pages):
                self.memory.mark_evictable(ptype, pages)
        node.key = node.key.concat(key)
        node.end += len(key)
        node.last_access = max(node.last_access, now)
        self.policy.update(node)

    def _attach_state(self, node: Node, state: Pages, now: int) -> None:
        assert self.state_type is not None
        if node is self.root or node.state is not None:
            self.memory.free(self.state_type, state)  # already checkpointed there
            return
        node.state = state
        # Admitting a checkpoint is an access: a branch point split out of an old edge would
        # otherwise keep that edge's old time and look stale the moment it becomes useful.
        node.last_access = max(node.last_access, now)
        if node.lock_ref == 0:
            self.memory.mark_evictable(self.state_type, state)
        self.policy.update(node)

    def _split(self, node: Node, at: int) -> Node:
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
            node.tombstones[slot] = max(0, tomb - at)
        upper = Node(
            self._new_id(),
            node.key.slice(0, at),
            node.parent,
            upper_kv,
            upper_tomb,
            node.last_access,
        )
        upper.lock_ref = node.lock_ref
        upper.hit_count = node.hit_count
        if node.inner:
            _share_inner(upper, node)
        node.parent.children[upper.key.head(0)] = upper
        node.key = node.key.slice(at)
        node.parent = upper
        node.start = upper.end
        upper.children[node.key.head(0)] = node
        self.policy.update(upper)
        self.policy.update(node)
        return upper

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    # ------------------------------------------------------------------ eviction

    def evict_for(self, ptype: PageType) -> bool:
        """Evictor callback of the memory: evict the policy's next victim."""
        victim = self.policy.victim()
        if victim is None:
            return False
        if victim.children:
            self.drop_state(victim)
        elif victim.inner:
            self._evict_last_segment(victim)
        else:
            self.evict_leaf(victim)
        return True

    def evict_leaf(self, node: Node) -> None:
        """Free everything an unlocked leaf holds and remove it (a run: all its segments)."""
        if node is self.root or node.children or node.lock_ref:
            raise ValueError(f"cannot evict {node!r}: only unlocked leaves are evicted whole")
        for slot, ptype in enumerate(self.kv_types):
            if len(node.kv[slot]):
                self.memory.free_evictable(ptype, node.kv[slot])
        states = [state for _, state in node.inner]
        if node.state is not None:
            states.append(node.state)
        for state in states:
            assert self.state_type is not None
            self.memory.free_evictable(self.state_type, state)
        self.evicted_states += len(states)
        parent = node.parent
        assert parent is not None
        del parent.children[node.key.head(0)]
        node.parent = None
        self.policy.remove(node)
        self.evicted_nodes += 1 + len(node.inner)
        if parent is not self.root:
            self.policy.update(parent)

    def _evict_last_segment(self, run: Node) -> None:
        """Evict the chain's leaf out of an unlocked leaf run: the pages and state of
        [last inner checkpoint, end). The run then ends at that checkpoint, with its state."""
        if run.children or run.lock_ref or not run.inner:
            raise ValueError(f"cannot evict the last segment of {run!r}: not an unlocked leaf run")
        at, state = run.inner[-1]
        keep = at - run.start
        for slot, ptype in enumerate(self.kv_types):
            tomb = run.tombstones[slot]
            head, tail = run.kv[slot].split(max(0, keep - tomb))
            if len(tail):
                self.memory.free_evictable(ptype, tail)
            run.kv[slot] = head
            run.tombstones[slot] = min(tomb, keep)
        if run.state is not None:
            assert self.state_type is not None
            self.memory.free_evictable(self.state_type, run.state)
            self.evicted_states += 1
        run.state = state
        run.inner = run.inner[:-1]
        run.key = run.key.truncated(keep)  # no copy: the key only ever shrinks from here
        run.end = at
        self.evicted_nodes += 1
        # No policy update: a policy that evicts runs ranks by what all segments share, none of
        # which changed (the chain's next leaf up takes the evicted one's place).

    def drop_state(self, node: Node) -> None:
        """Evict an inner node's checkpoint, keeping its KV (every token stays cached).

        With one child the node disappears: the child absorbs its edge and KV (Marconi). With
        more children the node stays as the branch point, without a state.
        """
        if node.lock_ref or not node.children or node.state is None:
            raise ValueError(
                f"cannot drop the state of {node!r}: needs an unlocked inner node with a checkpoint"
            )
        assert self.state_type is not None and node.parent is not None
        self.memory.free_evictable(self.state_type, node.state)
        node.state = None
        self.evicted_states += 1
        if len(node.children) == 1:
            self._merge_into_child(node)
        else:
            self.policy.update(node)

    def _merge_into_child(self, node: Node) -> None:
        assert node.parent is not None
        (child,) = node.children.values()
        for slot, ptype in enumerate(self.kv_types):
            if child.tombstones[slot]:
                # The child's leading pages are gone, so no hit beyond node.end can use the
                # node's window pages either: they become tombstones too.
                if len(node.kv[slot]):
                    self.memory.free_evictable(ptype, node.kv[slot])
                child.tombstones[slot] += len(node.key)
            else:
                child.kv[slot] = node.kv[slot].concat(child.kv[slot])
                child.tombstones[slot] = node.tombstones[slot]
        child.key = node.key.concat(child.key)
        child.inner = node.inner + child.inner
        child.parent = node.parent
        child.start = node.start
        node.parent.children[child.key.head(0)] = child
        node.parent = None
        node.children = {}
        self.policy.remove(node)
        self.policy.update(child)

    # ------------------------------------------------------------------ integrity

    def nodes(self) -> Iterator[Node]:
        """Every node but the root."""
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
