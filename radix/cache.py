"""The cache facade: one tree, one memory, one admission and one eviction policy.

Both drivers use it: the simulator (sequential and engine replay) and the SGLang backend. It
owns the logical clock, so recency is deterministic given the same request stream (identical
decisions on every tensor-parallel rank).
"""

from __future__ import annotations

from typing import NamedTuple

from mypy_extensions import mypyc_attr

from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.radix.contracts import AdmissionPolicy, CheckpointPlan, EvictionPolicy
from jenga_sglang.radix.cost import SpecNodeCost
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
        lock_prefix: bool = True,
    ) -> None:
        self.spec = spec
        # False: a request's own cached prefix stays a candidate while its insert evicts, as in
        # Marconi's reference simulator (the `marconi` bundles); see `_insert_unlocked`.
        self.lock_prefix = lock_prefix
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
        if plan.cache_len == 0:
            cached = False
        elif self.lock_prefix:
            cached = self._insert(seq, walk, plan, positions, now, owner)
        else:
            key = seq.slice(0, plan.cache_len)
            cached = self._insert_unlocked(input_tokens, key, hit, positions, now, owner)
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

    def _insert_unlocked(
        self,
        inp: TokenSeq,
        key: TokenSeq,
        hit: int,
        positions: tuple[int, ...],
        now: int,
        owner: int,
    ) -> bool:
        """`_insert` without the lock: the reference simulator evicts before it inserts and
        counts every node among the candidates, the request's own prefix included. An eviction
        that takes part of the prefix leaves more of the key to store, and may remove the node
        the planned branch checkpoint would have split (the reference then needs no branch
        state): walk again, re-plan, and allocate what is now missing, until nothing is.

        Terminates: inside the loop the tree only loses nodes, so the walk only shortens and
        `held` only grows (to at most len(key)); once the walk stops shortening the plan is
        fixed, and one more pass allocates exactly what it lacks."""
        kv: list[Pages] | None = None
        states: list[Pages] = []
        held = 0  # tokens [len(key) - held, len(key)) have pages in `kv`
        walked = -1
        try:
            while True:
                walk = self.tree.walk(key)
                if walk.length != walked and walked >= 0:
                    positions = self._replan(inp, walk, hit, len(key))
                walked = walk.length
                missing = len(key) - walk.length - held
                if missing > 0:
                    more = self.allocate_kv(missing, owner)
                    kv = (
                        more if kv is None else [m.concat(k) for m, k in zip(more, kv, strict=True)]
                    )
                    held += missing
                    continue  # the KV allocation may have evicted part of the prefix
                while len(states) > len(positions):
                    self._free(None, [states.pop()])
                if len(states) < len(positions):
                    states += self.allocate_states(len(positions) - len(states), owner)
                    continue  # so may the states'
                break
        except OutOfMemory:
            self._free(kv, states)
            return False
        if kv is None:
            kv = self.allocate_kv(0, owner)
        mapping = dict(zip(positions, states, strict=True))
        self.tree.insert(key, walk.length, kv, mapping, now, walk=walk)
        return True

    def _replan(self, inp: TokenSeq, walk: Walk, hit: int, total: int) -> tuple[int, ...]:
        """Checkpoint positions for the tree as it now is (the prefill already ran from `hit`)."""
        branch = self.admission.recall(inp, walk.prefix(len(inp)).branch())
        plan = self.admission.plan(branch, len(inp), total, hit)
        return plan.positions if self.tree.state_type is not None else ()

    def _free(self, kv: list[Pages] | None, states: list[Pages] | None) -> None:
        for ptype, pages in zip(self.tree.kv_types, kv or [], strict=False):
            self.memory.free(ptype, pages)
        state_type = self.tree.state_type
        for state in states or []:
            assert state_type is not None
            self.memory.free(state_type, state)

    def check_integrity(self) -> None:
        self.tree.check_integrity()
