"""Engine replay: continuous batching over a byte budget, timed by the cost model.

Requests arrive at their trace `ts`. Each engine step:

1. admits waiting requests first come, first served (head-of-line blocking, as SGLang does): the
   head is matched against the tree and admitted only if every running request's *reserve*
   plus its own fits in the memory that is free or evictable (`CacheMemory.fits`: bytes for
   memories whose bytes serve any page type, each type's own share for SGLang's static
   KV/Mamba split). A request's reserve is its remaining prefill tokens plus
   min(output, `decode_reserve_tokens`) minus what it decoded (one KV page per token in every
   attention group), plus one SSM state. The matched prefix is locked while it runs;
2. decodes one token for every request whose prefill is done: it feeds back the token at
   position p = input + decoded - 1 (FLOPs F(p + 1) - F(p), reads the KV of p + 1 tokens and
   the SSM state) and allocates the KV page of the token it produces. Then it spends up to
   `chunk_tokens` on prefill chunks in admission order (chunked prefill; the step that
   completes a prefill also produces the first token);
3. advances the clock by `CostModel.step_seconds` of the step's FLOPs and bytes read;
4. finishes requests that produced all their output: their input + output is inserted into
   the tree (admission plan and checkpoints as in sequential replay), the lock released, and
   the tuner told.

When an allocation fails even after evicting everything evictable, the most recently admitted
request is retracted: its pages are freed, its lock released, and it goes back to the head of
the queue to start over (its first TTFT stands); from then on it reserves its whole output,
so it is not re-admitted only to be pushed out again. A request that cannot fit alone is
rejected.

TTFT = end of the step that produced the first token - arrival. Memory is sampled after each step as
used (running requests and locked nodes) / evictable (cached, unlocked) / wasted / free, and as
bytes held (used + evictable) by KV pages and by SSM state pages; each step's duration is kept.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from mypy_extensions import mypyc_attr

from jenga_sglang.bench.cost_model import CostModel, decode_bytes, weight_bytes
from jenga_sglang.bench.replay import PackedRequest, ReplayStats
from jenga_sglang.policies.tuning import AlphaTuner
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.lease import Lease
from jenga_sglang.radix.pages import OutOfMemory, PageKind, PageType


# Sent between processes: mypyc-compiled frozen dataclasses cannot be unpickled, so this one
# stays a Python class in the optional build (scripts/build_compiled.py).
@mypyc_attr(native_class=False)
@dataclass(frozen=True)
class EngineConfig:
    chunk_tokens: int = 8192  # prefill tokens per step (SGLang's chunked_prefill_size default)
    max_running: int = 256  # requests in one batch at most
    decode_reserve_tokens: int = 256  # decode tokens reserved per request at admission

    def __post_init__(self) -> None:
        for name in ("chunk_tokens", "max_running"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine {name} must be >= 1, got {getattr(self, name)}")
        if self.decode_reserve_tokens < 0:
            raise ValueError(f"decode_reserve_tokens must be >= 0: {self.decode_reserve_tokens}")


@dataclass
class EngineStats(ReplayStats):
    """ReplayStats plus latency, batching and memory over (simulated) time."""

    ttfts: list[float] = field(default_factory=list)
    makespan_s: float = 0.0
    steps: int = 0
    retractions: int = 0
    rejected: int = 0
    #: One row per step: (time, decode batch, prefill tokens, used, evictable, wasted, free bytes).
    timeline: list[tuple[float, int, int, int, int, int, int]] = field(default_factory=list)
    #: One row per step: bytes held (used + evictable) by KV pages and by SSM state pages.
    held_by_kind: list[tuple[int, int]] = field(default_factory=list)
    #: One entry per step: its duration from the cost model.
    step_seconds: list[float] = field(default_factory=list)


class _Running:
    """A request in the batch; its lease holds the pages of tokens [hit, computed)."""

    def __init__(self, index: int, req: PackedRequest, hit: int) -> None:
        self.index, self.req, self.hit = index, req, hit
        self.lease: Lease | None = None  # set once admitted
        self.done = hit  # input tokens whose KV exists (cached or prefilled)
        self.decoded = 0  # output tokens produced

    @property
    def held(self) -> Lease:
        assert self.lease is not None, "a running request holds a lease"
        return self.lease

    @property
    def prefilling(self) -> bool:
        return self.done < len(self.req.inp)

    @property
    def finished(self) -> bool:
        return not self.prefilling and self.decoded >= len(self.req.out)


class EngineSim:
    """One engine replay of `requests` through `cache` (see the module docstring)."""

    def __init__(
        self,
        requests: Sequence[PackedRequest],
        cache: PrefixCache,
        tuner: AlphaTuner | None,
        cost: CostModel | None = None,
        config: EngineConfig | None = None,
        check: bool = False,
    ) -> None:
        self.requests, self.cache, self.tuner, self.check = requests, cache, tuner, check
        self.cost = cost or CostModel()
        self.config = config or EngineConfig()
        self.spec, self.memory = cache.spec, cache.memory
        self.kv_types = cache.kv_types
        self.state_type = cache.state_type
        self.weights = weight_bytes(self.spec, self.cost.weight_dtype_bytes)
        self.waiting: deque[int] = deque()
        self.running: list[_Running] = []
        self.first_token: dict[int, float] = {}
        self.retracted: set[int] = set()
        self.stats = EngineStats()
        self.now = 0.0

    # ------------------------------------------------------------------ main loop

    def run(self) -> EngineStats:
        start, cpu_start = time.perf_counter(), time.process_time()
        arrivals, n = 0, len(self.requests)
        while arrivals < n or self.waiting or self.running:
            while arrivals < n and self.requests[arrivals].ts <= self.now:
                self.waiting.append(arrivals)
                arrivals += 1
            if not self.waiting and not self.running:
                self.now = self.requests[arrivals].ts
                continue
            self._admit()
            if self.running:
                self._step()
        st = self.stats
        st.makespan_s = self.now
        st.ttfts = [self.first_token[i] - self.requests[i].ts for i in sorted(self.first_token)]
        st.finish_timing(start, cpu_start, self.tuner)
        return st

    # ------------------------------------------------------------------ admission

    def _demand(self, kv_tokens: int, states: int) -> Counter[PageType]:
        """Pages for `kv_tokens` tokens in every attention group plus `states` SSM states."""
        demand: Counter[PageType] = Counter(dict.fromkeys(self.kv_types, kv_tokens))
        if self.state_type is not None:
            demand[self.state_type] = states
        return demand

    def _reserve(self, run: _Running) -> Counter[PageType]:
        req = run.req
        tokens = len(req.inp) - run.done
        # A retracted request reserves its whole output: otherwise it is re-admitted at once
        # and retracted again while the requests that pushed it out keep growing.
        cap = len(req.out) if run.index in self.retracted else self.config.decode_reserve_tokens
        tokens += max(0, min(len(req.out), cap) - run.decoded)
        return self._demand(tokens, 0 if run.lease is not None and run.lease.holds_state else 1)

    def _fits_alone(self, req: PackedRequest) -> bool:
        demand = self._demand(len(req.inp) + len(req.out), 1)
        return self.memory.fits(demand, empty=True)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.max_running:
            index = self.waiting[0]
            req = self.requests[index]
            if not self._fits_alone(req):
                self.waiting.popleft()
                self.stats.rejected += 1
                continue
            found = self.cache.lookup(req.inp)
            run = _Running(index, req, found.length)
            committed = self._reserve(run)
            for other in self.running:
                committed.update(self._reserve(other))
            if not self.memory.fits(committed):
                if not self.running:  # nothing will free memory: it can never run
                    self.waiting.popleft()
                    self.stats.rejected += 1
                    continue
                return
            self.waiting.popleft()
            total = len(req.inp) + len(req.out)
            run.lease = self.cache.admit(req.inp, found, total, owner=index, lock=True)
            self.running.append(run)

    # ------------------------------------------------------------------ one step

    def _step(self) -> None:
        flops, read = 0.0, self.weights
        first: list[_Running] = []
        decoding = [r for r in self.running if not r.prefilling and not r.finished]
        for run in decoding:
            if run in self.running and self._grow(run, 1):
                pos = len(run.req.inp) + run.decoded - 1  # the token fed back in
                flops += self.spec.prefill_flops(pos, pos + 1)
                read += decode_bytes(self.spec, pos + 1)
                run.decoded += 1
                if run.decoded == 1:  # a full-input hit: the first token comes from decode
                    first.append(run)
        prefill_tokens, prefilled = self._prefill_chunks()
        flops += sum(f for f, _ in prefill_tokens)
        seconds = self.cost.step_seconds(flops, read)
        self.now += seconds
        self.stats.step_seconds.append(seconds)
        for run in first + prefilled:
            if run in self.running:
                self.first_token.setdefault(run.index, self.now)
        for run in [r for r in self.running if r.finished]:
            self.first_token.setdefault(run.index, self.now)  # requests without output
            self._finish(run)
        self._record(len(decoding), sum(n for _, n in prefill_tokens))
        if self.check:
            self.cache.check_integrity()

    def _prefill_chunks(self) -> tuple[list[tuple[float, int]], list[_Running]]:
        budget = self.config.chunk_tokens
        chunks: list[tuple[float, int]] = []
        first: list[_Running] = []
        for run in [r for r in self.running if r.prefilling]:
            if budget == 0:
                break
            if run not in self.running:  # retracted by an earlier allocation this step
                continue
            n = min(budget, len(run.req.inp) - run.done)
            if not self._grow(run, n):
                continue
            chunks.append((self.spec.prefill_flops(run.done, run.done + n), n))
            run.done += n
            budget -= n
            if not run.prefilling:
                first.append(run)
                if run.req.out and self._grow(run, 1):
                    run.decoded = 1
        return chunks, first

    def _grow(self, run: _Running, count: int) -> bool:
        """Allocate KV for `count` more tokens of `run`, retracting others when short.

        False when `run` itself was retracted (or rejected) instead.
        """
        while True:
            try:
                self.cache.extend(run.held, count)  # the running SSM state is allocated first
            except OutOfMemory:
                victim = self.running[-1]
                alone = len(self.running) == 1
                self._retract(victim)
                if victim is run:
                    if alone:  # retracted with nothing else running: it can never fit
                        self.waiting.remove(run.index)
                        self.stats.rejected += 1
                    return False
                continue
            return True

    def _retract(self, run: _Running) -> None:
        self.cache.release(run.held)  # its pages and lock; a new lease when re-admitted
        self.running.remove(run)
        self.waiting.appendleft(run.index)
        self.retracted.add(run.index)
        self.stats.retractions += 1

    # ------------------------------------------------------------------ completion

    def _finish(self, run: _Running) -> None:
        self.running.remove(run)
        req, lease = run.req, run.held
        seq = req.inp.concat(req.out)
        # Stored only past the hit; a commit that does not fit leaves the request uncached.
        fits = lease.plan.cache_len <= run.hit or self.cache.commit(lease, seq)
        self.cache.release(lease, seq)
        planned = len(lease.plan.positions)
        self.stats.count(len(req.inp), len(req.out), run.hit, self.spec.flops, planned, fits)
        if self.tuner is not None:
            self.tuner.after_request(self.cache, req.inp, req.out)

    def _record(self, decode_batch: int, prefill_tokens: int) -> None:
        used = evictable = 0
        held = [0, 0]  # KV, SSM state
        for ptype in self.memory.page_types:
            u = self.memory.usage(ptype)
            used += u.used * u.page_bytes
            evictable += u.evictable * u.page_bytes
            held[ptype.kind is PageKind.STATE] += (u.used + u.evictable) * u.page_bytes
        wasted = self.memory.wasted_bytes()
        free = self.memory.capacity_bytes - used - evictable - wasted
        self.stats.steps += 1
        self.stats.timeline.append(
            (self.now, decode_batch, prefill_tokens, used, evictable, wasted, free)
        )
        self.stats.held_by_kind.append((held[0], held[1]))


def replay_engine(
    requests: Sequence[PackedRequest],
    cache: PrefixCache,
    tuner: AlphaTuner | None,
    cost: CostModel | None = None,
    config: EngineConfig | None = None,
    check: bool = False,
) -> EngineStats:
    """Engine replay of `requests` (in ts order) through `cache`."""
    return EngineSim(requests, cache, tuner, cost, config, check).run()
