"""The engine's side of the cache: what its running requests take from and give back to it.

Every call the stepped engine (bench/simulation/engine.py) makes into the prefix cache lives here,
in a few small methods over `PrefixCache`'s lifecycle (radix/lease.py): `_lookup` (match the head
of the queue, nothing recorded), `_admit` (touch, plan, lock: a lease), `_grow` / `_allocate`
(extend the lease as it runs, pushing others out when short), `_retract` (release the lease
when pushed out) and `_commit` (commit and release when finished). The engine's loop, which
decides *when* each happens, subclasses `EngineCache`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from mypy_extensions import mypyc_attr

from jenga_sglang.bench.simulation.engine_batch import Running
from jenga_sglang.bench.simulation.engine_config import EngineConfig, EngineStats
from jenga_sglang.bench.traces.packed import PackedRequest
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.match import MatchResult
from jenga_sglang.radix.pages import OutOfMemory, PageType


@mypyc_attr(allow_interpreted_subclasses=True)
class EngineObserver:
    """Watches an engine run (the fragmentation study, bench/studies/frag_timeline.py); every hook
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
    with the leases their requests hold on the cache."""

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
        self.kv_types = cache.kv_types
        self.state_type = cache.state_type
        self.waiting: deque[int] = deque()
        self.running: list[Running] = []
        self.retracted: set[int] = set()
        self.progress: dict[int, int] = {}  # output tokens a pushed-out request will re-prefill
        self.stats = EngineStats()

    # ------------------------------------------------------------------ admission

    def _lookup(self, index: int) -> tuple[Running, MatchResult]:
        """Request `index` as it would run: its longest cached prefix, nothing recorded yet."""
        req = self.requests[index]
        found = self.cache.lookup(req.inp)
        return Running(index, req, found.length, self.progress.get(index, 0)), found

    def _admit(self, run: Running, found: MatchResult) -> bool:
        """`run` joins the batch: its prefix is touched and locked, its checkpoints planned.
        With `state_at_admission` it also takes its running SSM state now; False (the lease
        released, `run` left waiting) when that state cannot be had."""
        req = run.req
        total = len(req.inp) + len(req.out)
        run.lease = self.cache.admit(req.inp, found, total, owner=run.index, lock=True)
        if self.config.state_at_admission and self.state_type is not None:
            try:
                self.cache.extend(run.lease, 0)
            except OutOfMemory:
                self.observer.allocation_failed(self, self.states, 1)
                self.cache.release(run.lease)
                run.lease = None
                return False
        self.progress.pop(run.index, None)
        return True

    # ------------------------------------------------------------------ running

    def _grow(self, run: Running, count: int) -> bool:
        """Extend `run`'s lease by `count` tokens, pushing out others when short.

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

    def _allocate(self, run: Running, count: int) -> tuple[PageType, ...] | None:
        """Pages for `count` more tokens (the lease takes the running state first); None when
        they were had, else the page types of the allocation that failed."""
        lease = run.held
        try:
            self.cache.extend(lease, count)
        except OutOfMemory:
            return self.kv_types if lease.holds_state or self.state_type is None else self.states
        return None

    def _retract(self, run: Running) -> None:
        """Push `run` out of the batch to the head of the queue (see EngineConfig.preemption):
        its lease released (pages and lock), a new one when it is admitted again."""
        self.cache.release(run.held)
        run.lease = None
        self.running.remove(run)
        self.waiting.appendleft(run.index)
        self.retracted.add(run.index)
        if self.config.preemption == "reprefill":
            self.progress[run.index] = run.decoded
        self.stats.retractions += 1

    # ------------------------------------------------------------------ completion

    def _commit(self, run: Running) -> bool:
        """Hand a finished request to the cache: its planned part past the hit into the tree
        (the rest of its pages freed), the lease released; False when it could not be
        stored."""
        lease, req = run.held, run.req
        seq = req.inp.concat(req.out)
        fits = lease.plan.cache_len <= run.hit or self.cache.commit(lease, seq)
        self.cache.release(lease, seq)
        return fits
