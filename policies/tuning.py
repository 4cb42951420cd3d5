"""Online tuning of the FLOP-aware eviction weight alpha.

Both tuners observe the request stream of a `PrefixCache` (`after_request`) and replay a window
of recorded requests from a snapshot of the cache once per alpha of a grid, keeping the alpha
whose replay scored best.

marconi (faithful to the paper)
    alpha = 0 until the first eviction. Then snapshot the cache and record a bootstrap window as
    long as the number of requests seen before that eviction; replay it for every alpha of
    {0, 0.1, ..., 2.0} (in worker processes with `run_grid_parallel`); adopt the alpha that saved
    the most FLOPs; tune once.

jenga (ours, `SlidingTuner`)
    Re-tunes all along the stream on windows of recent requests, each replayed from a snapshot
    taken at its start, over alphas in [0, 1] (alpha = 0 is recency only, i.e. LRU), scoring
    prefill tokens skipped. Ties go to the smaller alpha, so recency wins unless FLOP awareness
    does better on the replay. Pauses between windows grow while the choice is stable. A failing
    replay (exception, killed worker) keeps the last good alpha and is logged; it never breaks
    the cache.

Replays are deterministic (the cache uses a logical clock), so every tensor-parallel rank that
runs the same stream picks the same alpha. That also means a window the cache itself served one
request at a time (`cache.serve`, as the sequential replay does) with the alpha in force *is* the
replay of that alpha from the window's snapshot: drivers that pass each `ServeResult` to
`after_request` spare the tuner that replay, and its score is the served one.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum

from jenga_sglang.radix.cache import PrefixCache, ServeResult
from jenga_sglang.radix.tokens import TokenSeq

log = logging.getLogger(__name__)

ALPHA_GRID: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(21))
#: The sliding tuner re-tunes often, so it uses a coarser grid (0 = recency only, i.e. LRU).
JENGA_GRID: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)

#: A recorded request: (input tokens, output tokens).
Recorded = tuple[TokenSeq, TokenSeq]


@dataclass
class TuningLog:
    """What the tuner did, for reports."""

    tunings: int = 0
    failures: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's CPU time (replays in worker processes excluded)
    history: list[tuple[int, float]] = field(default_factory=list)  # (request index, alpha)


@contextmanager
def _deep_recursion() -> Iterator[None]:
    """pickle recurses once per tree level (node -> children -> node): allow deep trees."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 100_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def snapshot(cache: PrefixCache) -> bytes:
    """A restorable copy of the whole cache (tree, memory accounting, policy indexes)."""
    with _deep_recursion():
        return pickle.dumps(cache, protocol=pickle.HIGHEST_PROTOCOL)


class Objective(Enum):
    """What a replay maximises: prefill FLOPs saved (Marconi) or prefill tokens skipped."""

    FLOPS = "flops"
    TOKENS = "tokens"


def served_score(served: Sequence[ServeResult]) -> tuple[float, int]:
    """(FLOPs saved, tokens hit) of requests served, summed in the order `replay_score` uses."""
    saved, hits = 0.0, 0
    for result in served:
        saved += result.flops_saved
        hits += result.hit_tokens
    return saved, hits


def replay_score(snap: bytes, window: Sequence[Recorded], alpha: float) -> tuple[float, int]:
    """(FLOPs saved, tokens hit) by replaying `window` from `snap` with the given alpha."""
    with _deep_recursion():
        cache: PrefixCache = pickle.loads(snap)
    cache.eviction.alpha = alpha
    saved, hits = 0.0, 0
    for i, (inp, out) in enumerate(window):
        result = cache.serve(inp, out, owner=-1 - i)
        saved += result.flops_saved
        hits += result.hit_tokens
    return saved, hits


Scores = list[tuple[float, int]]
GridRunner = Callable[[bytes, Sequence[Recorded], Sequence[float]], Scores]


def run_grid_inline(snap: bytes, window: Sequence[Recorded], grid: Sequence[float]) -> Scores:
    return [replay_score(snap, window, a) for a in grid]


def run_grid_parallel(snap: bytes, window: Sequence[Recorded], grid: Sequence[float]) -> Scores:
    """The grid in worker processes (fork: the snapshot is shared, not re-sent per task)."""
    workers = max(1, min(len(grid), mp.cpu_count()))
    ctx = mp.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(replay_score, snap, window, a) for a in grid]
        return [f.result() for f in futures]


class AlphaTuner(ABC):
    def __init__(
        self,
        grid: Sequence[float] = ALPHA_GRID,
        runner: GridRunner | None = None,
        objective: Objective = Objective.FLOPS,
    ) -> None:
        if not grid or any(a < 0 for a in grid):
            raise ValueError(f"alpha grid must be non-empty and >= 0: {grid}")
        self.grid = tuple(grid)
        self.runner: GridRunner = runner or run_grid_inline
        self.objective = objective
        self.log = TuningLog()
        self.seen = 0

    @abstractmethod
    def after_request(
        self, cache: PrefixCache, inp: TokenSeq, out: TokenSeq, served: ServeResult | None = None
    ) -> None:
        """Called after each request the cache served; `served` is what `cache.serve` returned
        when the driver served it sequentially (None otherwise, e.g. in engine replay)."""

    def _tune(
        self,
        cache: PrefixCache,
        snap: bytes,
        window: Sequence[Recorded],
        served: Sequence[ServeResult | None] = (),
    ) -> bool:
        """Replay the grid and adopt the best alpha; False (alpha kept) if the replay failed.

        `served` holds the cache's own results for the window's requests: when all are there,
        they score the alpha in force without a replay (see the module docstring).
        """
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            scores = self._scores(cache.eviction.alpha, snap, window, served)
        except Exception:
            self.log.failures += 1
            log.exception("alpha tuning failed; keeping alpha=%s", cache.eviction.alpha)
            return False
        finally:
            self.log.seconds += time.perf_counter() - start
            self.log.cpu_seconds += time.process_time() - cpu_start
        pick = 0 if self.objective is Objective.FLOPS else 1
        best = max(range(len(self.grid)), key=lambda i: (scores[i][pick], -self.grid[i]))
        cache.eviction.alpha = self.grid[best]
        self.log.tunings += 1
        self.log.history.append((self.seen, self.grid[best]))
        return True

    def _scores(
        self,
        current: float,
        snap: bytes,
        window: Sequence[Recorded],
        served: Sequence[ServeResult | None],
    ) -> Scores:
        """One score per grid alpha: the served one for `current` if known, else replayed."""
        known: tuple[float, int] | None = None
        if len(served) == len(window) and None not in served:
            known = served_score([r for r in served if r is not None])
        todo = [a for a in self.grid if known is None or a != current]
        replayed = self.runner(snap, window, todo)
        if len(replayed) != len(todo):
            raise RuntimeError(f"{len(replayed)} scores for {len(todo)} alphas")
        by_alpha = dict(zip(todo, replayed, strict=True))
        return [
            known if a not in by_alpha and known is not None else by_alpha[a] for a in self.grid
        ]

    @staticmethod
    def _evicted(cache: PrefixCache) -> bool:
        return cache.tree.evicted_nodes + cache.tree.evicted_states > 0


class MarconiTuner(AlphaTuner):
    """Tune once, on a bootstrap window after the first eviction (the reference's method)."""

    def __init__(self, grid: Sequence[float] = ALPHA_GRID, runner: GridRunner | None = None):
        super().__init__(grid, runner)
        self._snap: bytes | None = None
        self._window: list[Recorded] = []
        self._served: list[ServeResult | None] = []
        self._window_len = 0
        self._done = False

    def after_request(
        self, cache: PrefixCache, inp: TokenSeq, out: TokenSeq, served: ServeResult | None = None
    ) -> None:
        self.seen += 1
        if self._done:
            return
        if self._snap is None:
            cache.eviction.alpha = 0.0
            if self._evicted(cache):
                self._snap = snapshot(cache)
                self._window_len = self.seen
            return
        self._window.append((inp, out))
        self._served.append(served)
        if len(self._window) >= self._window_len:
            self._tune(cache, self._snap, self._window, self._served)
            self._done = True
            self._snap, self._window, self._served = None, [], []


class SlidingTuner(AlphaTuner):
    """Re-tune periodically on a window of recent requests, from a snapshot at its start.

        first eviction
             |<- window ->|<-- pause -->|<- window ->|<----- pause x 2 ----->|<- window ->|
             snap  record  tune          snap  record tune (same alpha)       snap ...

    The first window starts at the first eviction (before it every alpha behaves the same).
    After each tuning the tuner pauses; when the choice did not change, the pause doubles (up
    to `max_pause`), so a stable workload is re-checked ever more rarely, and a change of the
    chosen alpha resets it to `pause`. Replay cost is len(grid) x window per tuning, not
    len(grid) x the whole stream.

    The grid stops at alpha = 1: beyond it the FLOP-efficiency term can outweigh the whole
    recency range, so a node that is never hit again can outlive every recently used one.
    """

    def __init__(
        self,
        window: int = 300,
        pause: int = 300,
        max_pause: int = 4800,
        grid: Sequence[float] = JENGA_GRID,
        runner: GridRunner | None = None,
        objective: Objective = Objective.TOKENS,
    ) -> None:
        super().__init__(grid, runner, objective)
        if window < 1 or not 0 <= pause <= max_pause:
            raise ValueError(
                f"need window >= 1 and 0 <= pause <= max_pause: {window}, {pause}, {max_pause}"
            )
        self.window = window
        self.base_pause = pause
        self.max_pause = max_pause
        self.pause = pause
        self._wait = 0
        self._snap: bytes | None = None
        self._recorded: list[Recorded] = []
        self._served: list[ServeResult | None] = []

    def after_request(
        self, cache: PrefixCache, inp: TokenSeq, out: TokenSeq, served: ServeResult | None = None
    ) -> None:
        self.seen += 1
        if self._snap is not None:
            self._recorded.append((inp, out))
            self._served.append(served)
            if len(self._recorded) >= self.window:
                self._finish_window(cache, self._snap)
        elif self._wait > 0:
            self._wait -= 1
        elif self._evicted(cache):
            self._snap = snapshot(cache)

    def _finish_window(self, cache: PrefixCache, snap: bytes) -> None:
        before = cache.eviction.alpha
        tuned = self._tune(cache, snap, self._recorded, self._served)
        stable = tuned and cache.eviction.alpha == before
        self.pause = min(self.max_pause, self.pause * 2) if stable else self.base_pause
        self._wait = self.pause
        self._snap, self._recorded, self._served = None, [], []
