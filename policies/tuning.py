"""Online tuning of the FLOP-aware eviction weight alpha.

Both tuners observe the request stream of a `PrefixCache` (`after_request`) and replay a window
of recorded requests from a snapshot of the cache once per alpha of a grid, keeping the alpha
that saved the most prefill FLOPs in the replay.

marconi (faithful to the paper)
    alpha = 0 until the first eviction. Then snapshot the cache and record a bootstrap window as
    long as the number of requests seen before that eviction; replay it for every alpha of
    {0, 0.1, ..., 2.0} in parallel processes; adopt the best; tune once.

jenga (ours)
    Re-tunes on a sliding window: every `window` requests it replays the last `window` requests
    from the snapshot taken at the window's start, over the same grid plus plain LRU, and keeps
    the winner. Ties go to the smaller alpha, so LRU-like behaviour wins unless FLOP awareness
    does better on the replay. A failing replay (exception, killed worker) keeps the last good
    alpha and is logged; it never breaks the cache.

Replays are deterministic (the cache uses a logical clock), so every tensor-parallel rank that
runs the same stream picks the same alpha.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.tokens import TokenSeq

log = logging.getLogger(__name__)

ALPHA_GRID: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(21))

#: A recorded request: (input tokens, output tokens).
Recorded = tuple[TokenSeq, TokenSeq]


@dataclass
class TuningLog:
    """What the tuner did, for reports."""

    tunings: int = 0
    failures: int = 0
    seconds: float = 0.0
    history: list[tuple[int, float]] = field(default_factory=list)  # (request index, alpha)


def snapshot(cache: PrefixCache) -> bytes:
    """A restorable copy of the whole cache (tree, memory accounting, policy indexes)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 100_000))
    try:
        return pickle.dumps(cache, protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        sys.setrecursionlimit(limit)


def replay_flops(snap: bytes, window: Sequence[Recorded], alpha: float) -> float:
    """FLOPs saved by replaying `window` from `snap` with the given alpha."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 100_000))
    try:
        cache: PrefixCache = pickle.loads(snap)
    finally:
        sys.setrecursionlimit(limit)
    cache.eviction.alpha = alpha
    saved = 0.0
    for i, (inp, out) in enumerate(window):
        saved += cache.serve(inp, out, owner=-1 - i).flops_saved
    return saved


GridRunner = Callable[[bytes, Sequence[Recorded], Sequence[float]], list[float]]


def run_grid_inline(snap: bytes, window: Sequence[Recorded], grid: Sequence[float]) -> list[float]:
    return [replay_flops(snap, window, a) for a in grid]


def run_grid_parallel(
    snap: bytes, window: Sequence[Recorded], grid: Sequence[float]
) -> list[float]:
    """The grid in worker processes (fork: the snapshot is shared, not re-sent per task)."""
    workers = max(1, min(len(grid), mp.cpu_count()))
    ctx = mp.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(replay_flops, snap, window, a) for a in grid]
        return [f.result() for f in futures]


class AlphaTuner(ABC):
    def __init__(self, grid: Sequence[float] = ALPHA_GRID, runner: GridRunner | None = None):
        if not grid or any(a < 0 for a in grid):
            raise ValueError(f"alpha grid must be non-empty and >= 0: {grid}")
        self.grid = tuple(grid)
        self.runner: GridRunner = runner or run_grid_inline
        self.log = TuningLog()
        self.seen = 0

    @abstractmethod
    def after_request(self, cache: PrefixCache, inp: TokenSeq, out: TokenSeq) -> None:
        """Called after each request the cache served."""

    def _tune(self, cache: PrefixCache, snap: bytes, window: Sequence[Recorded]) -> None:
        start = time.perf_counter()
        try:
            scores = self.runner(snap, window, self.grid)
        except Exception:
            self.log.failures += 1
            log.exception("alpha tuning failed; keeping alpha=%s", cache.eviction.alpha)
            return
        finally:
            self.log.seconds += time.perf_counter() - start
        best = max(range(len(self.grid)), key=lambda i: (scores[i], -self.grid[i]))
        cache.eviction.alpha = self.grid[best]
        self.log.tunings += 1
        self.log.history.append((self.seen, self.grid[best]))

    @staticmethod
    def _evicted(cache: PrefixCache) -> bool:
        return cache.tree.evicted_nodes + cache.tree.evicted_states > 0


class MarconiTuner(AlphaTuner):
    """Tune once, on a bootstrap window after the first eviction (the reference's method)."""

    def __init__(self, grid: Sequence[float] = ALPHA_GRID, runner: GridRunner | None = None):
        super().__init__(grid, runner)
        self._snap: bytes | None = None
        self._window: list[Recorded] = []
        self._window_len = 0
        self._done = False

    def after_request(self, cache: PrefixCache, inp: TokenSeq, out: TokenSeq) -> None:
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
        if len(self._window) >= self._window_len:
            self._tune(cache, self._snap, self._window)
            self._done = True
            self._snap, self._window = None, []


class SlidingTuner(AlphaTuner):
    """Re-tune every `window` requests on the last window, from a snapshot at its start."""

    def __init__(
        self,
        window: int = 200,
        grid: Sequence[float] = ALPHA_GRID,
        runner: GridRunner | None = None,
    ) -> None:
        super().__init__(grid, runner)
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self._snap: bytes | None = None
        self._recorded: list[Recorded] = []

    def after_request(self, cache: PrefixCache, inp: TokenSeq, out: TokenSeq) -> None:
        self.seen += 1
        if self._snap is None:
            if self._evicted(cache):
                self._snap = snapshot(cache)
            return
        self._recorded.append((inp, out))
        if len(self._recorded) >= self.window:
            self._tune(cache, self._snap, self._recorded)
            self._snap, self._recorded = snapshot(cache), []
