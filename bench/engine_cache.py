"""The engine's side of the cache: what its running requests take from and give back to it.

Every call the stepped engine (bench/engine.py) makes into the prefix cache lives here, in a
few small methods, one per step of a request's life: `_lookup` (match the head of the queue),
`_admit` (touch, plan, lock), `_grow` / `_allocate` (pages as it runs, pushing others out when
short), `_release` (pages and lock back when pushed out) and `_commit` (into the tree when
finished). The engine's loop, which decides *when* each happens, subclasses `EngineCache`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from mypy_extensions import mypyc_attr

from jenga_sglang.bench.engine_batch import Running, join
from jenga_sglang.bench.engine_config import EngineConfig, EngineStats
from jenga_sglang.bench.replay import PackedRequest
from jenga_sglang.policies.base import CheckpointPlan
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.match import MatchResult
from jenga_sglang.radix.pages import OutOfMemory, Pages, PageType


@mypyc_attr(allow_interpreted_subclasses=True)
class EngineObserver:
    """Watches an engine run (the fragmentation study, bench/frag_timeline.py); every hook
    does nothing unless overridden."""

    def admitted(self, engine: EngineCache, run: Running) -> None:
        """`run` joined the batch."""

    def allocation_failed(
        self, engine: EngineCache, ptypes: tuple[PageType, ...], count: int
    ) -> None:
        """Allocating `count` pages of one of `ptypes` failed; nothing was pushed out yet."""

    def stepped(self, engine: EngineCache, decode_batch: int, prefill_tokens: int) -> None:
        """A step ended (its finished requests gone, its memory sampled)."""


class EngineCache:
    """The batch (`running`, in admission order) and the queue (`waiting`, request indices)
    with the cache pages and locks their requests hold."""

    def __init__(
        self,
        requests: Sequence[PackedRequest],
        cache: PrefixCache,
        config: EngineConfig,
        observer: EngineObserver | None,
    ) -> None:
        self.requests, self.cache, self.config = requests, cache, config
        self.observer = observer or EngineObserver()
        self.spec, self.memory = cache.spec, cache.memory
        self.state_bytes = self.spec.state_bytes
        self.kv_types = cache.tree.kv_types
        self.state_type = cache.tree.state_type
        self.waiting: deque[int] = deque()
        self.running: list[Running] = []
        self.retracted: set[int] = set()
        self.progress: dict[int, int] = {}  # output tokens a pushed-out request will re-prefill
        self.stats = EngineStats()

    # ------------------------------------------------------------------ admission

    def _lookup(self, index: int) -> tuple[Running, MatchResult]:
        """Request `index` as it would run: its longest cached prefix, nothing changed yet."""
        req = self.requests[index]
        result = self.cache.tree.match(req.inp)
        decoded = self.progress.get(index, 0)
        return Running(index, req, result.length, result.node, CheckpointPlan(), decoded), result

    def _admit(self, run: Running, result: MatchResult) -> None:
        """`run` joins the batch: its prefix is touched and locked, its checkpoints planned."""
        req = run.req
        self.progress.pop(run.index, None)
        self.cache.tree.touch(result, self.cache.tick())
        total = len(req.inp) + len(req.out)
        run.plan = self.cache.plan(req.inp, result, total)
        self.cache.tree.lock(run.anchor)

    # ------------------------------------------------------------------ running

    def _grow(self, run: Running, count: int) -> bool:
        """Allocate KV for `count` more tokens of `run`, pushing out others when short.

        False when `run` itself was pushed out (or rejected) instead. Terminates: every
        failure pushes a request out, and `run` is among them."""
        while True:
            failed = self._allocate(run, count)
            if failed is None:
                return True
            self.observer.allocation_failed(self, failed, 1 if failed == self.states else count)
            victim = self.running[-1]
            alone = len(self.running) == 1
            self._retract(victim)
            if victim is run:
                if alone:  # pushed out with nothing else running: it can never fit
                    self.waiting.remove(run.index)
                    self.stats.rejected += 1
                return False

    @property
    def states(self) -> tuple[PageType, ...]:
        return () if self.state_type is None else (self.state_type,)

    def _grow_states(self, run: Running) -> bool:
        """Take `run`'s live SSM state now (at admission); False if it cannot be had."""
        if not self.state_bytes:
            return True
        try:
            run.states = self.cache.allocate_states(1, owner=run.index)
        except OutOfMemory:
            self.observer.allocation_failed(self, self.states, 1)
            return False
        return True

    def _allocate(self, run: Running, count: int) -> tuple[PageType, ...] | None:
        """Pages for `count` more tokens (and the live state, held first); None when they
        were had, else the page types of the allocation that failed."""
        try:
            if self.state_bytes and not run.states:
                run.states = self.cache.allocate_states(1, owner=run.index)
        except OutOfMemory:
            return self.states
        try:
            pages = self.cache.allocate_kv(count, owner=run.index)
        except OutOfMemory:
            return self.kv_types
        if not run.kv:
            run.kv = [[] for _ in pages]
        for chunks, new in zip(run.kv, pages, strict=True):
            chunks.append(new)
        return None

    def _retract(self, run: Running) -> None:
        """Push `run` out of the batch to the head of the queue (see EngineConfig.preemption)."""
        self._release(run)
        self.running.remove(run)
        self.waiting.appendleft(run.index)
        self.retracted.add(run.index)
        if self.config.preemption == "reprefill":
            self.progress[run.index] = run.decoded
        self.stats.retractions += 1

    def _release(self, run: Running) -> None:
        """Give back everything `run` holds: its pages and the lock on its prefix."""
        self._release_pages(run)
        self.cache.tree.unlock(run.anchor)

    def _release_pages(self, run: Running) -> None:
        """Free the pages `run` allocated (the cached prefix it matched stays in the tree)."""
        tree = self.cache.tree
        for ptype, chunks in zip(tree.kv_types, run.kv, strict=False):
            for pages in chunks:
                if len(pages):
                    self.memory.free(ptype, pages)
        if tree.state_type is not None:
            for state in run.states:
                self.memory.free(tree.state_type, state)
        run.kv, run.states = [], []

    # ------------------------------------------------------------------ completion

    def _commit(self, run: Running) -> None:
        """Hand a finished request to the cache: its planned part into the tree (the rest of
        its pages freed), the lock released."""
        req, plan, tree = run.req, run.plan, self.cache.tree
        cached = False
        if plan.cache_len > run.hit:
            cached = self._insert(run, plan)
        else:
            self._release_pages(run)
        tree.unlock(run.anchor)
        seq = req.inp.concat(req.out)
        self.cache.finish(seq, plan.cache_len if cached else 0, plan.expendable_from)

    def _insert(self, run: Running, plan: CheckpointPlan) -> bool:
        """Hand the request's pages for [hit, cache_len) and its checkpoints to the tree;
        False when its states could not be allocated (its pages are released)."""
        tree, positions = self.cache.tree, plan.positions
        extra = max(0, len(positions) - len(run.states)) if tree.state_type else 0
        try:
            states = run.states + self.cache.allocate_states(extra, owner=run.index)
        except OutOfMemory:
            self._release_pages(run)
            self.stats.uncached_requests += 1
            return False
        keep = plan.cache_len - run.hit
        kv: list[Pages] = []
        for ptype, chunks in zip(tree.kv_types, run.kv, strict=True):
            head, tail = join(chunks).split(keep)
            if len(tail):
                self.memory.free(ptype, tail)
            kv.append(head)
        if tree.state_type is not None:
            for state in states[len(positions) :]:
                self.memory.free(tree.state_type, state)
        key = run.req.inp.concat(run.req.out).slice(0, plan.cache_len)
        mapping = dict(zip(positions, states, strict=False))
        tree.insert(key, run.hit, kv, mapping, self.cache.tick())
        run.kv, run.states = [], []
        return True
