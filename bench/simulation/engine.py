"""The stepped engine: continuous batching over a memory, timed by the cost model.

One loop for every stepped figure: the engine-mode replays (`jenga-bench replay --mode engine`,
`long-batch`) with the default `EngineConfig`, and the fragmentation study
(bench/studies/frag_timeline.py), which runs it under its own config and watches it through an
`EngineObserver`. Requests arrive at their trace `ts`. Each engine step:

1. *schedules*: admits waiting requests first come, first served (head-of-line blocking, as
   SGLang does). The head is matched against the tree and admitted only if every running
   request's reserve plus its own passes the admission rule; a request's reserve is the rest
   of its prefill plus its decode reserve (bench/simulation/engine_batch.py `reserve_tokens`), one
   KV page per token in every attention group, plus one SSM state until it holds one. The matched
   prefix is locked while it runs;
2. *runs* the batch (`step_order`): decodes one token per decoding request (it feeds back the
   token at position p = input + decoded - 1: FLOPs F(p + 1) - F(p), reading the KV of p + 1
   tokens and the SSM state, and allocates the KV page of the token it produces) and prefills
   chunks of the prompts (`chunk_budget`), then advances the clock by `CostModel.step_seconds`;
3. *post-processes*: a request that produced all its output is finished: its input + output
   goes to the tree (admission plan and checkpoints as in sequential replay), the lock is
   released and the tuner told. The memory is sampled and the observer called.

When an allocation fails even after evicting everything evictable, the most recently admitted
request is pushed out: its pages are freed, its lock released, and it goes back to the head of
the queue, to start over or to re-prefill what it had (`preemption`; its first TTFT stands). A
request that cannot fit alone, or that is pushed out with nothing else running, is rejected.

TTFT = end of the step that produced the first token - arrival. Memory is sampled after each
step as used (running requests and locked nodes) / evictable (cached, unlocked) / wasted / free,
and as bytes held (used + evictable) by KV pages and by SSM state pages; each step's duration
is kept.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from jenga_sglang.bench.simulation.cost_model import CostModel, decode_bytes, weight_bytes
from jenga_sglang.bench.simulation.engine_batch import (
    Running,
    admits,
    demand,
    record_step,
    reserve_tokens,
)
from jenga_sglang.bench.simulation.engine_cache import EngineCache, EngineObserver
from jenga_sglang.bench.simulation.engine_config import EngineConfig, EngineStats
from jenga_sglang.bench.traces.packed import PackedRequest
from jenga_sglang.policies.tuning import AlphaTuner
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.pages import PageType

__all__ = ["EngineConfig", "EngineObserver", "EngineSim", "EngineStats", "replay_engine"]


class EngineSim(EngineCache):
    """One engine replay of `requests` through `cache` (see the module docstring)."""

    def __init__(
        self,
        requests: Sequence[PackedRequest],
        cache: PrefixCache,
        tuner: AlphaTuner | None,
        cost: CostModel | None = None,
        config: EngineConfig | None = None,
        check: bool = False,
        observer: EngineObserver | None = None,
    ) -> None:
        super().__init__(requests, cache, config or EngineConfig(), observer)
        self.tuner, self.check = tuner, check
        self.cost = cost or CostModel()
        self.weights = weight_bytes(self.spec, self.cost.weight_dtype_bytes)
        self.first_token: dict[int, float] = {}
        self.now = 0.0
        # The current step's work: decode FLOPs, prefill FLOPs (summed apart, as the float sums
        # of the figures were), bytes read; and the requests that finished in its course.
        self.flops, self.chunk_flops, self.read = 0.0, 0.0, 0.0
        self.left: list[Running] = []

    def run(self) -> EngineStats:
        """Step until every request arrived and left. Terminates once each request has
        finished or been rejected: one that can never fit is rejected rather than retried."""
        start, cpu_start = time.perf_counter(), time.process_time()
        arrivals, n = 0, len(self.requests)
        while arrivals < n or self.waiting or self.running:
            while arrivals < n and self.requests[arrivals].ts <= self.now:
                self.waiting.append(arrivals)
                arrivals += 1
            if not self.waiting and not self.running:
                self.now = self.requests[arrivals].ts
                continue
            self._schedule()
            if self.running:
                self._step()
        st = self.stats
        st.makespan_s = self.now
        st.ttfts = [self.first_token[i] - self.requests[i].ts for i in sorted(self.first_token)]
        st.finish_timing(start, cpu_start, self.tuner)
        return st

    # ------------------------------------------------------------------ schedule

    def _reserve(self, run: Running) -> Counter[PageType]:
        tokens = reserve_tokens(run, self.config, run.index in self.retracted)
        return demand(self.kv_types, self.state_type, tokens, 0 if run.holds_state else 1)

    def _fits_alone(self, req: PackedRequest) -> bool:
        pages = demand(self.kv_types, self.state_type, len(req.inp) + len(req.out), 1)
        return self.memory.fits(pages, empty=True)

    def _schedule(self) -> None:
        """Admit from the head of the queue while the rule allows (each pass admits or
        rejects the head, or returns)."""
        while self.waiting and len(self.running) < self.config.max_running:
            req = self.requests[self.waiting[0]]
            if not self._fits_alone(req):
                self._reject()
                continue
            run, result = self._lookup(self.waiting[0])
            committed = self._reserve(run)
            for other in self.running:
                committed.update(self._reserve(other))
            ready = admits(self.memory, committed, self.config.admission_rule)
            if ready:
                ready = self._admit(run, result)
            if not ready:
                if not self.running:  # nothing will free memory: it can never run
                    self._reject()
                    continue
                return
            self.waiting.popleft()
            self.running.append(run)
            self.observer.admitted(self, run)

    def _reject(self) -> None:
        self.waiting.popleft()
        self.stats.rejected += 1

    # ------------------------------------------------------------------ run one step

    def _step(self) -> None:
        self.flops, self.chunk_flops, self.read = 0.0, 0.0, self.weights
        self.left = []
        if self.config.step_order == "phased":
            first, batch, prefill = self._run_phased()
        else:
            first, batch, prefill = self._run_in_order()
        seconds = self.cost.step_seconds(self.flops + self.chunk_flops, self.read)
        self.now += seconds
        self.stats.step_seconds.append(seconds)
        for run in first:
            if run in self.running or run in self.left:
                self.first_token.setdefault(run.index, self.now)
        for run in [r for r in self.running if r.finished]:
            self.first_token.setdefault(run.index, self.now)  # requests without output
            self._finish(run)
        record_step(self.stats, self.memory, self.now, batch, prefill)
        self.observer.stepped(self, batch, prefill)
        if self.check:
            self.cache.check_integrity()

    def _run_phased(self) -> tuple[list[Running], int, int]:
        """Decode every decoding request, then prefill chunks in admission order; the step
        that completes a prefill also produces a token. (first tokens, batch, prefill)"""
        first: list[Running] = []
        decoding = [r for r in self.running if not r.prefilling and not r.finished]
        for run in decoding:
            if run in self.running and self._decode(run) and run.decoded == 1:
                first.append(run)  # a full-input hit: the first token comes from decode
        budget, prefill = self.config.chunk_tokens, 0
        for run in [r for r in self.running if r.prefilling]:
            if budget == 0:
                break
            if run not in self.running:  # pushed out by an earlier allocation this step
                continue
            n = self._prefill(run, budget)
            prefill += n
            if self.config.chunk_budget == "shared":
                budget -= n
            if n and not run.prefilling:
                first.append(run)
                if run.decoded < len(run.req.out) and self._grow(run, 1):
                    run.decoded += 1
        return first, len(decoding), prefill

    def _run_in_order(self) -> tuple[list[Running], int, int]:
        """Each running request in admission order prefills a chunk or decodes a token; a
        request leaves the moment it finishes. (first tokens, batch, prefill)"""
        first: list[Running] = []
        budget, batch, prefill = self.config.chunk_tokens, 0, 0
        for run in list(self.running):
            if run not in self.running:  # pushed out by an earlier allocation this step
                continue
            if run.prefilling:
                n = self._prefill(run, budget)
                prefill += n
                if self.config.chunk_budget == "shared":
                    budget -= n
            elif not run.finished and self._decode(run):
                batch += 1
                if run.decoded == 1:
                    first.append(run)
                if run.finished:
                    self._finish(run)
                    self.left.append(run)
        return first, batch, prefill

    def _decode(self, run: Running) -> bool:
        """One token for `run`; False when it was pushed out instead."""
        if not self._grow(run, 1):
            return False
        pos = len(run.req.inp) + run.decoded - 1  # the token fed back in
        self.flops += self.spec.prefill_flops(pos, pos + 1)
        self.read += decode_bytes(self.spec, pos + 1)
        run.decoded += 1
        return True

    def _prefill(self, run: Running, budget: int) -> int:
        """A chunk of at most `budget` tokens of `run`'s prefill; the tokens prefilled."""
        n = min(budget, run.target - run.done)
        if n == 0 or not self._grow(run, n):
            return 0
        self.chunk_flops += self.spec.prefill_flops(run.done, run.done + n)
        run.done += n
        return n

    # ------------------------------------------------------------------ post-process

    def _finish(self, run: Running) -> None:
        self.running.remove(run)
        planned = len(run.held.plan.positions)
        fits = self._commit(run)
        req = run.req
        self.stats.count(len(req.inp), len(req.out), run.hit, self.spec.flops, planned, fits)
        if self.tuner is not None:
            self.tuner.after_request(self.cache, req.inp, req.out)


def replay_engine(
    requests: Sequence[PackedRequest],
    cache: PrefixCache,
    tuner: AlphaTuner | None,
    cost: CostModel | None = None,
    config: EngineConfig | None = None,
    check: bool = False,
    observer: EngineObserver | None = None,
) -> EngineStats:
    """Engine replay of `requests` (in ts order) through `cache`."""
    return EngineSim(requests, cache, tuner, cost, config, check, observer).run()
