"""Online tuning of the FLOP-aware eviction weight alpha: what every tuner shares.

A tuner (policies/tuners.py: Marconi's `MarconiTuner`, our `SlidingTuner`) observes the
request stream of a `PrefixCache` (`after_request`) and replays a window of recorded requests
from a snapshot of the cache once per alpha of a grid, keeping the alpha whose replay scored
best. A failing replay (exception, killed worker) keeps the last good alpha and is logged; it
never breaks the cache.

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
#: Alphas past 1 the sliding tuner replays only when its grid's alphas all score the same.
BEYOND_GRID: tuple[float, ...] = (1.25, 1.5, 2.0)
#: The score of an alpha that was not replayed: below every replayed one, so never adopted.
UNSCORED: tuple[float, int] = (float("-inf"), -1)


@dataclass
class TuningLog:
    """What the tuner did, for reports."""

    tunings: int = 0
    failures: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's CPU time (replays in worker processes excluded)
    history: list[tuple[int, float]] = field(default_factory=list)  # (request index, alpha)
    widened: int = 0  # tunings that also replayed alphas beyond the grid (`widened_scores`)


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
        beyond: Sequence[float] = (),
    ) -> None:
        """`grid` is scored on every window; `beyond` only on a window where every alpha of
        `grid` scores the same (`widened_scores`). Alphas are chosen from `self.grid`, the two
        together."""
        if not grid or any(a < 0 for a in (*grid, *beyond)):
            raise ValueError(f"alpha grid must be non-empty and >= 0: {grid}, {beyond}")
        if set(grid) & set(beyond):
            raise ValueError(f"beyond {tuple(beyond)} repeats alphas of the grid {tuple(grid)}")
        self.base = tuple(grid)
        self.beyond = tuple(beyond)
        self.grid = (*self.base, *self.beyond)
        self.runner: GridRunner = runner or run_grid_inline
        self.objective = objective
        self.background = background
        self.log = TuningLog()
        self.seen = 0
        self._alpha_before = 0.0

    def after_request(
        self,
        cache: PrefixCache,
        inp: TokenSeq,
        out: TokenSeq,
        served: ServeResult | None = None,
        namespace: str | None = None,
    ) -> None:
        """Called after each request the cache served; `served` is what `cache.serve` returned
        when the driver served it sequentially (None otherwise, e.g. in engine replay), and
        `namespace` the request's (replays serve it there).

        With a background worker, a replay in flight is adopted once it is due. The tuner goes
        on observing meanwhile (a window may still be growing), but submits nothing while
        `busy`."""
        self.seen += 1
        if self.busy:
            assert self.background is not None
            outcome = self.background.collect(self.seen)
            if outcome is not None:
                self._adopt(cache, outcome)
        self._observe(cache, (inp, out, namespace), served)

    @property
    def busy(self) -> bool:
        """A replay is in flight in the background worker, not yet adopted."""
        return self.background is not None and self.background.busy

    @abstractmethod
    def _observe(self, cache: PrefixCache, request: Recorded, served: ServeResult | None) -> None:
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
            widened_scores,
            self.runner,
            self.base,
            self.beyond,
            self._score_index(),
            cache.eviction.alpha,
            snap,
            window,
            served,
        )
        self._run(cache, job)

    def _score_index(self) -> int:
        """Which part of a (FLOPs saved, tokens hit) score the objective maximises."""
        return 0 if self.objective is Objective.FLOPS else 1

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
        self.log.widened += int(any(s != UNSCORED for s in outcome[len(self.base) :]))
        pick = self._score_index()
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


def widened_scores(
    runner: GridRunner,
    grid: Sequence[float],
    beyond: Sequence[float],
    pick: int,
    current: float,
    snap: bytes,
    window: Sequence[Recorded],
    served: Sequence[ServeResult | None],
) -> Scores:
    """Scores of `grid` then `beyond`; `beyond` is replayed only when every alpha of `grid`
    scored the same on the objective (`pick`: 0 FLOPs, 1 tokens), else it is `UNSCORED`."""
    scores = grid_scores(runner, grid, current, snap, window, served)
    if len({score[pick] for score in scores}) > 1 or not beyond:
        return scores + [UNSCORED] * len(beyond)
    return scores + grid_scores(runner, beyond, current, snap, window, served)
