"""The cache facade: one tree, one memory, one admission and one eviction policy.

Every driver goes through it, never through the tree: the sequential simulator (`serve`), the
engine replay and the SGLang backend. It owns the logical clock, so recency is deterministic
given the same request stream (identical decisions on every tensor-parallel rank).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from mypy_extensions import mypyc_attr

from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.radix.commit import insert_extended, insert_unlocked, insert_walked
from jenga_sglang.radix.contracts import (
    AdmissionPolicy,
    CheckpointPlan,
    EvictionPolicy,
    TierPolicy,
)
from jenga_sglang.radix.cost import SpecNodeCost
from jenga_sglang.radix.host import HostCopies, HostTier
from jenga_sglang.radix.lease import Lease
from jenga_sglang.radix.match import MatchResult, Walk, deepest_whole
from jenga_sglang.radix.memory import CacheMemory
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import Pages, PageType
from jenga_sglang.radix.tokens import TokenSeq
from jenga_sglang.radix.tree import RadixTree


class ServeResult(NamedTuple):
    """What one sequentially served request got from the cache (a named tuple: one per
    request, built in C)."""

    input_tokens: int
    hit_tokens: int
    flops_saved: float
    states_planned: int
    cached: bool  # False when its pages could not be admitted (larger than what is free)
    # with a host tier (radix/host.py): tokens of the hit loaded from host memory, the bytes
    # that load moved, and the bytes device eviction moved to host while it was served
    host_hit_tokens: int = 0
    host_load_bytes: int = 0
    host_write_bytes: int = 0


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class PrefixCache:
    """The request lifecycle over one tree (radix/lease.py):

    * `lookup(tokens)`: the longest reusable prefix, with no side effect but the walk's shape;
    * `admit(tokens, found, ...)`: the request is taken: the hit is recorded for the eviction
      policy, the admission plans its checkpoints, its prefix is locked; returns a `Lease`;
    * `extend(lease, count)`: pages for `count` more tokens it computes (engine steps);
    * `commit(lease, seq)`: store the planned part of input + output, along the walk the lease
      holds (or, after other requests changed the tree, from its locked node down);
    * `release(lease, seq)`: free what the lease still holds, unlock, and (`seq` given: the
      request finished) hand the sequence to the policies.

    `serve` is the sequential simulator written on these. The SGLang backend, whose scheduler
    owns locks and pages, uses `lookup`/`admit` without a lock, `pin`/`unpin` for the nodes
    SGLang locks, and `reach`/`store` to insert the slots SGLang computed.

    Requests of different namespaces (LoRA adapters, cache salts: radix/spaces.py) never share:
    `lookup`, `admit`, `reach`, `store`, `finish` and `serve` take the request's `namespace`
    (None, the default, for a request without one). One memory and one eviction policy serve
    them all.
    """

    def __init__(
        self,
        spec: ModelSpec,
        memory: CacheMemory,
        eviction: EvictionPolicy,
        admission: AdmissionPolicy,
        lock_prefix: bool = True,
        page: int = 1,
    ) -> None:
        self.spec = spec
        # False: a request's own cached prefix stays a candidate while its insert evicts, as in
        # Marconi's reference simulator (the `marconi` bundles); see radix/commit.py.
        self.lock_prefix = lock_prefix
        self.memory = memory
        self.eviction = eviction
        self.admission = admission
        # `page`: tokens per KV page of the server's allocator; hits, node boundaries and
        # checkpoints then fall on page boundaries (radix/tree.py, Pages).
        self.tree = RadixTree(spec, memory, eviction, page)
        state_type = self.tree.state_type
        self.cost = SpecNodeCost(
            spec,
            [memory.page_bytes(t) for t in self.tree.kv_types],
            memory.page_bytes(state_type) if state_type is not None else 0,
        )
        eviction.bind_cost(self.cost)
        self.clock = 0

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    # ------------------------------------------------------------------ read-only figures

    @property
    def kv_types(self) -> tuple[PageType, ...]:
        """The page type of each attention group, in the order pages are handed over."""
        return self.tree.kv_types

    @property
    def state_type(self) -> PageType | None:
        return self.tree.state_type

    @property
    def root(self) -> Node:
        return self.tree.root

    @property
    def host(self) -> HostTier | None:
        """The host-memory tier, if one is attached (`attach_host`)."""
        return self.tree.host

    def attach_host(
        self, memory: CacheMemory, policy: TierPolicy, copies: HostCopies | None = None
    ) -> HostTier:
        """Give the cache a host tier over `memory`, run by `policy` (docs/host-tier.md), its
        bytes moved by `copies` (None: pages are counts, as in the simulator). `serve` loads
        host hits back; the SGLang backend calls the tier's `prepare` itself
        (binding/host/); the engine replay must not attach one."""
        if not self.lock_prefix:
            raise ValueError(
                "a host tier needs the request's prefix locked while it is served "
                "(lock_prefix): the reference simulator's unlocked insert may demote it"
            )
        policy.bind_cost(self.cost)
        return HostTier(self.tree, memory, policy, copies)

    @property
    def evicted_nodes(self) -> int:
        return self.tree.evicted_nodes

    @property
    def evicted_states(self) -> int:
        return self.tree.evicted_states

    def nodes(self) -> Iterator[Node]:
        """Every cached node (the root excluded)."""
        return self.tree.nodes()

    # ------------------------------------------------------------------ the lifecycle

    def lookup(self, tokens: TokenSeq, namespace: str | None = None) -> MatchResult:
        """Longest prefix of `tokens` in `namespace` every layer group can reuse. Records
        nothing: a driver may look up a request it then leaves waiting."""
        return self.tree.match(tokens, namespace)

    def warm(self, found: MatchResult) -> None:
        """The hit `found` of a request `lookup` matched and the driver has not taken yet (a
        server matches every waiting request each round, and most wait): it keeps its
        recency, counting nothing; `admit` counts it once, when the request is taken."""
        if found.path:
            self.tree.policy.warm(found.path, self.tick())

    def admit(
        self,
        tokens: TokenSeq,
        found: MatchResult,
        total_len: int | None = None,
        *,
        owner: int = 0,
        lock: bool = False,
        ahead: Walk | None = None,
        namespace: str | None = None,
    ) -> Lease:
        """Take a request whose input `tokens` `lookup` matched as `found`: record the hit,
        plan its checkpoints for input + output of `total_len` tokens (None: plan nothing,
        the driver decides what it inserts), and with `lock` protect its prefix until
        `release`. `ahead`: the walk of the whole sequence the request will store, when
        nothing changes the tree before its commit (sequential serving); the lock then covers
        the part of it the plan stores. `namespace`: the one `lookup` matched in, where the
        lease's sequence is stored."""
        now = self.tick()
        self.tree.touch(found, now, ahead)
        plan = (
            CheckpointPlan()
            if total_len is None
            else self.plan(tokens, found, total_len, ahead, namespace)
        )
        lease = Lease(tokens, found, plan, owner, now, ahead, namespace)
        if lock:
            lease._locked = True
            if ahead is None:
                lease._anchor = found.node
                # a later walk of the request's tokens may start there: the hit's last node
                # may extend past the hit on another sequence (no Mamba group ends hits at
                # node ends)
                lease._start = deepest_whole(found.path, found.length)
            else:
                path = ahead.prefix(plan.cache_len).path
                lease._anchor = path[-1] if path else None
            self.tree.lock(lease._anchor)
        return lease

    def plan(
        self,
        tokens: TokenSeq,
        result: MatchResult,
        total_len: int,
        ahead: Walk | None = None,
        namespace: str | None = None,
    ) -> CheckpointPlan:
        """The admission's plan for input `tokens` matched as `result`, `total_len` tokens with
        the output. `ahead`: the walk of the whole sequence, which an admission that
        `plans_on_sequence` needs (sequential serving has it; an engine or a server does not
        know the output yet, and is refused rather than planned on the input unsaid)."""
        if self.admission.plans_on_sequence:
            if ahead is None:
                raise ValueError(
                    f"{type(self.admission).__name__} plans on where input + output leaves the "
                    "tree: only sequential serving knows the output at admission"
                )
            walk = ahead.prefix(total_len)
        else:
            walk = result.walk
        branch = self.admission.recall(tokens, walk.branch(), namespace)
        return self.on_pages(
            self.admission.plan(branch, len(tokens), total_len, result.length), result.length
        )

    def on_pages(self, plan: CheckpointPlan, hit: int) -> CheckpointPlan:
        """`plan` as the tree can keep it: on page boundaries (`CheckpointPlan.on_pages`)."""
        return plan if self.tree.page == 1 else plan.on_pages(self.tree.page, hit)

    def extend(self, lease: Lease, count: int) -> None:
        """Pages for `count` more tokens of the request (and, first, its running SSM state).
        Raises OutOfMemory when they do not fit after evicting; what was allocated before
        stays with the lease."""
        if self.tree.state_type is not None and not lease._states:
            lease._states = self.allocate_states(1, lease._owner)
        pages = self.allocate_kv(count, lease._owner)
        if not lease._kv:
            lease._kv = [[] for _ in pages]
        for chunks, new in zip(lease._kv, pages, strict=True):
            chunks.append(new)

    def commit(self, lease: Lease, seq: TokenSeq, now: int | None = None) -> bool:
        """Store the first `plan.cache_len` tokens of `seq` (input + output) with the pages the
        lease computed (`extend`), or along the walk it was admitted with (`ahead`), allocating
        what it lacks (radix/commit.py). False when they do not fit: `release` then frees what
        the lease holds. `now`: the time of the insert (default: a new tick)."""
        plan = lease.plan
        if plan.cache_len == 0:
            return False
        now = self.tick() if now is None else now
        key = seq.slice(0, plan.cache_len)
        positions = plan.positions if self.tree.state_type is not None else ()
        if not lease._locked:
            lease.cached = insert_unlocked(self, lease, key, positions, now)
        elif lease._kv:
            lease.cached = insert_extended(self, lease, key, positions, now)
        else:
            lease.cached = insert_walked(self, lease, key, positions, now)
        return lease.cached

    def release(self, lease: Lease, seq: TokenSeq | None = None) -> None:
        """Free the pages the lease still holds and unlock it. `seq` (input + output): the
        request finished, and the policies learn of it; None: it is retracted, to start over
        with a new lease."""
        for ptype, chunks in zip(self.tree.kv_types, lease._kv, strict=False):
            for pages in chunks:
                if len(pages):
                    self.memory.free(ptype, pages)
        self.free(None, lease._states)
        lease._kv, lease._states = [], []
        self.tree.unlock(lease._anchor)
        lease._anchor = lease._start = None
        if seq is not None:
            cached_len = lease.plan.cache_len if lease.cached else 0
            self.finish(seq, cached_len, lease.plan.expendable_from, lease.namespace)

    def finish(
        self,
        seq: TokenSeq,
        cached_len: int,
        expendable_from: int | None,
        namespace: str | None = None,
    ) -> None:
        """A request of `namespace` is done (`seq` = input + output, of which the tree got the
        first `cached_len` tokens): hand the cached part past `expendable_from` (its plan's) to
        the eviction policy, and let the admission remember the sequence."""
        if expendable_from is not None and expendable_from < cached_len:
            key = seq.slice(0, cached_len)
            chain = self.tree.chain_below(key, expendable_from, namespace)
            if chain:
                self.eviction.expend(chain)
        self.admission.finished(seq, namespace)

    # ------------------------------------------------------------------ SGLang's side

    def pin(self, node: Node | None) -> None:
        """Lock `node` and its ancestors (SGLang's scheduler holds the node as its lock)."""
        self.tree.lock(node)

    def unpin(self, node: Node | None) -> None:
        self.tree.unlock(node)

    def anchor(self, found: MatchResult) -> Node | None:
        """The node ending exactly where `found`'s hit ends (None for no hit), splitting the
        hit's last node when the hit ends inside its edge (an attention-only hit): the node a
        driver locks for the request then holds only tokens the request reuses."""
        node = found.node
        if node is None or node.end == found.length:
            return node
        return self.tree.split(node, found.length - node.start)

    def reach(self, key: TokenSeq, start: Node | None = None, namespace: str | None = None) -> Walk:
        """How much of `key` the tree holds in `namespace`: the walk a `store` of it then
        inserts along. `start`: a node the caller holds locked on `key`'s path
        (`RadixTree.walk`)."""
        return self.tree.walk(key, start, namespace)

    def store(
        self,
        key: TokenSeq,
        walk: Walk,
        kv: list[Pages],
        states: dict[int, Pages],
        start: int | None = None,
        namespace: str | None = None,
    ) -> Node:
        """Insert `key` in `namespace` along `walk` (`reach`'s in that namespace, the tree
        unchanged on its path since) with the caller's pages for [start, len(key)) (default:
        walk.length, what the tree lacks) and checkpoints; the node ending at len(key). Pages
        for positions the tree holds are freed, or revive its dropped window pages
        (radix/insert.py)."""
        begin = walk.length if start is None else start
        return self.tree.insert(key, begin, kv, states, self.tick(), walk, namespace)

    def evict(self, ptype: PageType) -> bool:
        """Evict the eviction policy's next victim, as the memory does when short of `ptype`."""
        return self.tree.evict_for(ptype)

    # ------------------------------------------------------------------ pages

    def allocate_kv(self, count: int, owner: int) -> list[Pages]:
        """Pages for `count` tokens in every attention group; all or nothing."""
        return self.memory.alloc_all([(ptype, count) for ptype in self.tree.kv_types], owner)

    def allocate_states(self, count: int, owner: int) -> list[Pages]:
        """`count` one-page SSM states; all or nothing."""
        state_type = self.tree.state_type
        if state_type is None or count == 0:
            return []
        return self.memory.alloc_each(state_type, count, owner)

    # ------------------------------------------------------------------ sequential serving

    def serve(
        self,
        input_tokens: TokenSeq,
        output_tokens: TokenSeq,
        owner: int,
        namespace: str | None = None,
    ) -> ServeResult:
        """Serve one request of `namespace` to completion (Marconi's sequential method).

        lookup(input) -> admit (plan checkpoints) -> compute the missing tokens -> commit
        (input + output) -> release. The tokens the tree already holds stay locked while the
        new pages are allocated, so eviction cannot pull the prefix out from under the insert.
        """
        seq = input_tokens.concat(output_tokens)
        # One walk of input + output serves the match (its first len(input) tokens) and the
        # insert (its first cache_len tokens): the insert's path stays locked in between.
        walk = self.tree.walk(seq, namespace=namespace)
        whole = len(input_tokens) - len(input_tokens) % self.tree.page  # a hit is whole pages
        found = self.tree.match_walk(walk.prefix(whole))
        host = self.tree.host
        loaded, written = (0, 0), 0
        if host is not None:  # load the hit's host part, move the walk to the device
            written = host.write_bytes
            prepared = host.prepare(self, seq, walk, whole, namespace)
            if prepared is not None:
                walk, found, loaded = prepared
        lease = self.admit(
            input_tokens,
            found,
            len(seq),
            owner=owner,
            lock=self.lock_prefix,
            ahead=walk,
            namespace=namespace,
        )
        positions = lease.plan.positions if self.tree.state_type is not None else ()
        hit = found.length
        scored = (len(input_tokens), hit, self.cost.flops(hit), len(positions))
        cached = self.commit(lease, seq, now=lease._now)
        self.release(lease, seq)
        if host is None:
            return ServeResult(*scored, cached=cached)
        return ServeResult(*scored, cached, *loaded, host.write_bytes - written)

    def free(self, kv: list[Pages] | None, states: list[Pages] | None) -> None:
        """Give back pages that never reached the tree: one run per attention group, states."""
        for ptype, pages in zip(self.tree.kv_types, kv or [], strict=False):
            self.memory.free(ptype, pages)
        state_type = self.tree.state_type
        for state in states or []:
            assert state_type is not None
            self.memory.free(state_type, state)

    def check_integrity(self) -> None:
        self.tree.check_integrity()
        if self.tree.host is not None:
            self.tree.host.check_host()
