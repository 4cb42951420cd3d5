"""Online tuning of the FLOP-aware eviction weight alpha.

Both tuners observe the request stream of a `PrefixCache` (`after_request`) and replay a window
of recorded requests from a snapshot of the cache once per alpha of a grid, keeping the alpha
whose replay scored best.

marconi (the reference's procedure, `MarconiTuner`)
    alpha = 0 until tuning. N = requests seen at the first eviction; after 5 x N requests,
    replay every request since the first, from the cache after the first request, once per
    alpha of {0, 0.1, ..., 2.0} (in worker processes with `run_grid_parallel`); adopt the alpha
    that saved the most FLOPs over the replay's last 500 requests; tune once.

jenga (ours, `SlidingTuner`)
    Re-tunes all along the stream on windows of recent requests, each replayed from a snapshot
    taken at its start, over alphas in [0, 1] (alpha = 0 is recency only, i.e. LRU), scoring
    prefill tokens skipped. Ties go to the smaller alpha, so recency wins unless FLOP awareness
    does better on the replay. Pauses between windows grow while the choice is stable. A failing
    replay (exception, killed worker) keeps the last good alpha and is logged; it never breaks
    the cache.

Both run their replays inline, or off the request path with a `BackgroundReplay` (the server:
policies/background.py), which adopts each result a fixed number of requests later.

Replays are deterministic (the cache uses a logical clock), so every tensor-parallel rank that
runs the same stream picks the same alpha. That also means a window the cache itself served one
request at a time (`cache.serve`, as the sequential replay does) with the alpha in force *is* the
replay of that alpha from the window's snapshot: drivers that pass each `ServeResult` to
`after_request` spare the tuner that replay, and its score is the served one.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import partial

from jenga_sglang.policies.background import BackgroundReplay
from jenga_sglang.policies.replay_grid import (
    GridRunner,
    Recorded,
    Scores,
    grid_scores,
    run_grid_inline,
    snapshot,
)
from jenga_sglang.radix.cache import PrefixCache, ServeResult
from jenga_sglang.radix.tokens import TokenSeq

log = logging.getLogger(__name__)

ALPHA_GRID: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(21))
#: The sliding tuner re-tunes often, so it uses a coarser grid (0 = recency only, i.e. LRU).
JENGA_GRID: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass
class TuningLog:
    """What the tuner did, for reports."""

    tunings: int = 0
    failures: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's CPU time (replays in worker processes excluded)
    history: list[tuple[int, float]] = field(default_factory=list)  # (request index, alpha)


class Objective(Enum):
    """What a replay maximises: prefill FLOPs saved (Marconi) or prefill tokens skipped."""

    FLOPS = "flops"
    TOKENS = "tokens"


class AlphaTuner(ABC):
    def __init__(
        self,
        grid: Sequence[float] = ALPHA_GRID,
        runner: GridRunner | None = None,
        objective: Objective = Objective.FLOPS,
        background: BackgroundReplay | None = None,
    ) -> None:
        if not grid or any(a < 0 for a in grid):
            raise ValueError(f"alpha grid must be non-empty and >= 0: {grid}")
        self.grid = tuple(grid)
        self.runner: GridRunner = runner or run_grid_inline
        self.objective = objective
        self.background = background
        self.log = TuningLog()
        self.seen = 0
        self._alpha_before = 0.0

    def after_request(
        self, cache: PrefixCache, inp: TokenSeq, out: TokenSeq, served: ServeResult | None = None
    ) -> None:
        """Called after each request the cache served; `served` is what `cache.serve` returned
        when the driver served it sequentially (None otherwise, e.g. in engine replay).

        With a background worker, a replay in flight is adopted once it is due, and no new
        window starts before that."""
        self.seen += 1
        if self.background is not None and self.background.busy:
            outcome = self.background.collect(self.seen)
            if outcome is None:
                return
            self._adopt(cache, outcome)
        self._observe(cache, inp, out, served)

    @abstractmethod
    def _observe(
        self, cache: PrefixCache, inp: TokenSeq, out: TokenSeq, served: ServeResult | None
    ) -> None:
        """The tuner's own bookkeeping for one request (windows, snapshots, when to tune)."""

    def _tuned(self, cache: PrefixCache, tuned: bool, before: float) -> None:  # noqa: B027 (optional hook)
        """Hook after a tuning ends: `tuned` False when the replay failed (alpha kept)."""

    def _tune(
        self,
        cache: PrefixCache,
        snap: bytes,
        window: Sequence[Recorded],
        served: Sequence[ServeResult | None] = (),
    ) -> None:
        """Replay the grid and adopt the best alpha, now or, with a background worker, when due.

        `served` holds the cache's own results for the window's requests: when all are there,
        they score the alpha in force without a replay (see the module docstring).
        """
        self._alpha_before = cache.eviction.alpha
        job = partial(
            grid_scores, self.runner, self.grid, cache.eviction.alpha, snap, window, served
        )
        self._run(cache, job)

    def _run(self, cache: PrefixCache, job: Callable[[], Scores]) -> None:
        """Score the grid now, or hand the job to the background worker."""
        if self.background is not None:
            self.background.submit(job, self.seen)
            return
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            outcome: Scores | Exception = job()
        except Exception as exc:
            outcome = exc
        finally:
            self.log.seconds += time.perf_counter() - start
            self.log.cpu_seconds += time.process_time() - cpu_start
        self._adopt(cache, outcome)

    def _adopt(self, cache: PrefixCache, outcome: Scores | Exception) -> None:
        """Take the best alpha of the scores, or keep the alpha (and log) on a failure."""
        before = self._alpha_before
        if not isinstance(outcome, Exception) and len(outcome) != len(self.grid):
            outcome = RuntimeError(f"{len(outcome)} scores for {len(self.grid)} alphas")
        if isinstance(outcome, Exception):
            self.log.failures += 1
            log.error(
                "alpha tuning failed (%s: %s); keeping alpha=%s",
                type(outcome).__name__,
                outcome,
                cache.eviction.alpha,
            )
            self._tuned(cache, False, before)
            return
        pick = 0 if self.objective is Objective.FLOPS else 1
        best = max(range(len(self.grid)), key=lambda i: (outcome[i][pick], -self.grid[i]))
        cache.eviction.alpha = self.grid[best]
        self.log.tunings += 1
        self.log.history.append((self.seen, self.grid[best]))
        self._tuned(cache, True, before)

    def _snapshot(self, cache: PrefixCache) -> bytes:
        """The window's starting point; empty on a rank that only receives the leader's scores."""
        if self.background is not None and not self.background.replays_here:
            return b""
        return snapshot(cache)

    @staticmethod
    def _evicted(cache: PrefixCache) -> bool:
        return cache.evicted_nodes + cache.evicted_states > 0


def tail_scores(
    runner: GridRunner,
    grid: Sequence[float],
    current: float,
    snap: bytes,
    window: Sequence[Recorded],
    served: Sequence[ServeResult | None],
    last: int,
) -> Scores:
    """Grid scores of only the last `last` requests of the window's replays.

    Replays are deterministic, so the replay of a prefix of the window is a prefix of the
    window's replay: the tail's score is the whole window's minus its head's. This costs a
    second (shorter) replay but works with any runner."""
    whole = grid_scores(runner, grid, current, snap, window, served)
    head_len = len(window) - last
    if head_len <= 0:
        return whole
    head = grid_scores(runner, grid, current, snap, window[:head_len], served[:head_len])
    return [(w[0] - h[0], w[1] - h[1]) for w, h in zip(whole, head, strict=True)]


#: The reference's defaults: window m x N (m = 5; its LMSys runs use 15), scored on the last 500.
BOOTSTRAP_MULTIPLIER = 5
SCORED_TAIL = 500


class MarconiTuner(AlphaTuner):
    """Tune once, as the reference does (github ruipeterpan/marconi, read 2026-11-24).

    alpha = 0 until then. N is the number of requests seen when the first eviction happens
    (the evicting request counted). When `multiplier * N` requests have been seen, every
    request since the first is replayed from the cache as it was after the first request
    (the same state as the reference's empty-cache start: the first request cannot evict or
    hit, whatever alpha) once per alpha, and the alpha whose replay saved the most FLOPs over
    its last `scored_tail` requests is adopted, ties to the smallest alpha.

    `from_start=False` is our earlier reading (kept as bundle `marconi-postevict`): snapshot at
    the first eviction, window of the next N requests, scored whole.
    """

    def __init__(
        self,
        grid: Sequence[float] = ALPHA_GRID,
        runner: GridRunner | None = None,
        background: BackgroundReplay | None = None,
        multiplier: int = BOOTSTRAP_MULTIPLIER,
        scored_tail: int | None = SCORED_TAIL,
        from_start: bool = True,
    ) -> None:
        super().__init__(grid, runner, background=background)
        if multiplier < 2 or (scored_tail is not None and scored_tail < 1):
            raise ValueError(f"need multiplier >= 2, scored_tail >= 1: {multiplier}, {scored_tail}")
        self.multiplier = multiplier
        self.scored_tail = scored_tail
        self.from_start = from_start
        self._snap: bytes | None = None
        self._window: list[Recorded] = []
        self._served: list[ServeResult | None] = []
        self._window_len = 0
        self._first_eviction = 0  # N: requests seen at the first eviction; 0 before it
        self._done = False

    def _observe(
        self, cache: PrefixCache, inp: TokenSeq, out: TokenSeq, served: ServeResult | None
    ) -> None:
        if self._done:
            return
        if self.from_start:
            self._observe_from_start(cache, inp, out, served)
            return
        if self._snap is None:
            cache.eviction.alpha = 0.0
            if self._evicted(cache):
                self._snap = self._snapshot(cache)
                self._window_len = self.seen
            return
        self._window.append((inp, out))
        self._served.append(served)
        if len(self._window) >= self._window_len:
            self._finish(cache, self._snap)

    def _observe_from_start(
        self, cache: PrefixCache, inp: TokenSeq, out: TokenSeq, served: ServeResult | None
    ) -> None:
        if self._snap is None:  # the first request: the replays start after it
            cache.eviction.alpha = 0.0
            self._snap = self._snapshot(cache)
        else:
            self._window.append((inp, out))
            self._served.append(served)
        if not self._first_eviction and self._evicted(cache):
            self._first_eviction = self.seen
        if self._first_eviction and self.seen >= self.multiplier * self._first_eviction:
            self._finish(cache, self._snap)

    def _finish(self, cache: PrefixCache, snap: bytes) -> None:
        window, served = self._window, self._served
        self._done = True
        self._snap, self._window, self._served = None, [], []
        if self.scored_tail is None:
            self._tune(cache, snap, window, served)
            return
        self._alpha_before = cache.eviction.alpha
        job = partial(
            tail_scores,
            self.runner,
            self.grid,
            cache.eviction.alpha,
            snap,
            window,
            served,
            self.scored_tail,
        )
        self._run(cache, job)


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
        background: BackgroundReplay | None = None,
    ) -> None:
        super().__init__(grid, runner, objective, background)
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

    def _observe(
        self, cache: PrefixCache, inp: TokenSeq, out: TokenSeq, served: ServeResult | None
    ) -> None:
        if self._snap is not None:
            self._recorded.append((inp, out))
            self._served.append(served)
            if len(self._recorded) >= self.window:
                self._finish_window(cache, self._snap)
        elif self._wait > 0:
            self._wait -= 1
        elif self._evicted(cache):
            self._snap = self._snapshot(cache)

    def _finish_window(self, cache: PrefixCache, snap: bytes) -> None:
        recorded, served = self._recorded, self._served
        self._snap, self._recorded, self._served = None, [], []
        self._tune(cache, snap, recorded, served)

    def _tuned(self, cache: PrefixCache, tuned: bool, before: float) -> None:
        stable = tuned and cache.eviction.alpha == before
        self.pause = min(self.max_pause, self.pause * 2) if stable else self.base_pause
        self._wait = self.pause
