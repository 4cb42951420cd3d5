"""The cache facade: one tree, one memory, one admission and one eviction policy.

Both drivers use it: the simulator (sequential and engine replay) and the SGLang backend. It
owns the logical clock, so recency is deterministic given the same request stream (identical
decisions on every tensor-parallel rank).
"""

from __future__ import annotations

from typing import NamedTuple

from mypy_extensions import mypyc_attr

from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.base import AdmissionPolicy, CheckpointPlan, EvictionPolicy
from jenga_sglang.policies.cost import SpecNodeCost
from jenga_sglang.radix.match import MatchResult, Walk
from jenga_sglang.radix.memory import CacheMemory
from jenga_sglang.radix.pages import OutOfMemory, Pages, PageType
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


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class PrefixCache:
    def __init__(
        self,
        spec: ModelSpec,
        memory: CacheMemory,
        eviction: EvictionPolicy,
        admission: AdmissionPolicy,
    ) -> None:
        self.spec = spec
        self.memory = memory
        self.eviction = eviction
        self.admission = admission
        self.tree = RadixTree(spec, memory, eviction)
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

    def match(self, tokens: TokenSeq, now: int | None = None) -> MatchResult:
        """Longest reusable prefix; records the hit for the eviction policy."""
        result = self.tree.match(tokens)
        self.tree.touch(result, self.tick() if now is None else now)
        return result

    def plan(self, tokens: TokenSeq, result: MatchResult, total_len: int) -> CheckpointPlan:
        branch = self.admission.recall(tokens, result.walk.branch())
        return self.admission.plan(branch, len(tokens), total_len, result.length)

    def finish(self, seq: TokenSeq, cached_len: int, expendable_from: int | None) -> None:
        """A request is done (`seq` = input + output, of which the tree got the first
        `cached_len` tokens): hand the cached part past `expendable_from` (its plan's) to the
        eviction policy, and let the admission remember the sequence."""
        if expendable_from is not None and expendable_from < cached_len:
            chain = self.tree.chain_below(seq.slice(0, cached_len), expendable_from)
            if chain:
                self.eviction.expend(chain)
        self.admission.finished(seq)

    def allocate_kv(self, count: int, owner: int) -> list[Pages]:
        """Pages for `count` tokens in every attention group; all or nothing."""
        got: list[tuple[PageType, Pages]] = []
        try:
            for ptype in self.tree.kv_types:
                got.append((ptype, self.memory.alloc(ptype, count, owner)))
        except OutOfMemory:
            for ptype, pages in got:
                self.memory.free(ptype, pages)
            raise
        return [pages for _, pages in got]

    def allocate_states(self, count: int, owner: int) -> list[Pages]:
        """`count` one-page SSM states; all or nothing."""
        state_type = self.tree.state_type
        if state_type is None or count == 0:
            return []
        return self.memory.alloc_each(state_type, count, owner)

    def serve(self, input_tokens: TokenSeq, output_tokens: TokenSeq, owner: int) -> ServeResult:
        """Serve one request to completion (Marconi's sequential method).

        match(input) -> plan checkpoints -> compute the missing tokens -> insert(input + output).
        The tokens the tree already holds stay locked while the new pages are allocated, so
        eviction cannot pull the prefix out from under the insert.
        """
        now = self.tick()
        seq = input_tokens.concat(output_tokens)
        # One walk of input + output serves the match (its first len(input) tokens) and the
        # insert (its first cache_len tokens): the insert's path stays locked in between.
        walk = self.tree.walk(seq)
        result = self.tree.match_walk(walk.prefix(len(input_tokens)))
        self.tree.touch(result, now)
        plan = self.plan(input_tokens, result, len(seq))
        positions = plan.positions if self.tree.state_type is not None else ()
        hit = result.length
        scored = (len(input_tokens), hit, self.cost.flops(hit), len(positions))
        cached = plan.cache_len > 0 and self._insert(seq, walk, plan, positions, now, owner)
        self.finish(seq, plan.cache_len if cached else 0, plan.expendable_from)
        return ServeResult(*scored, cached=cached)

    def _insert(
        self,
        seq: TokenSeq,
        walk: Walk,
        plan: CheckpointPlan,
        positions: tuple[int, ...],
        now: int,
        owner: int,
    ) -> bool:
        """Allocate the pages `plan` needs beyond what `walk` found and insert; False when they
        do not fit."""
        key = seq.slice(0, plan.cache_len)
        walk = walk.prefix(plan.cache_len)
        anchor = walk.path[-1] if walk.path else None
        self.tree.lock(anchor)
        try:
            kv = self.allocate_kv(len(key) - walk.length, owner)
            try:
                states = self.allocate_states(len(positions), owner)
            except OutOfMemory:
                for ptype, pages in zip(self.tree.kv_types, kv, strict=True):
                    self.memory.free(ptype, pages)
                raise
        except OutOfMemory:
            self.tree.unlock(anchor)
            return False
        mapping = dict(zip(positions, states, strict=True))
        self.tree.insert(key, walk.length, kv, mapping, now, walk=walk)
        self.tree.unlock(anchor)
        return True

    def check_integrity(self) -> None:
        self.tree.check_integrity()
