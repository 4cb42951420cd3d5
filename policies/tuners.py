"""The two alpha tuners: Marconi's one-shot procedure and our sliding re-tuning.

`AlphaTuner` (policies/tuning.py) observes the stream and runs the replays; a tuner decides
which requests to record, when to replay them and from which snapshot.

marconi (the reference's procedure, `MarconiTuner`)
    alpha = 0 until tuning. N = requests seen at the first eviction; after 5 x N requests,
    replay every request since the first, from the cache after the first request, once per
    alpha of {0, 0.1, ..., 2.0}; adopt the alpha that saved the most FLOPs over the replay's
    last 500 requests; tune once.

jenga (ours, `SlidingTuner`)
    Re-tunes all along the stream on windows of recent requests, each replayed from a snapshot
    taken at its start, over alphas in [0, 1] (and 1.25, 1.5, 2 when those all score the
    same), scoring prefill tokens skipped; the first window, from the first eviction, is tuned
    as it grows (32, 64, 128, 256 requests and its full length); pauses between windows grow
    while the choice is stable.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

from jenga_sglang.policies.background import BackgroundReplay
from jenga_sglang.policies.replay_grid import GridRunner, Recorded
from jenga_sglang.policies.tuning import (
    ALPHA_GRID,
    BEYOND_GRID,
    JENGA_GRID,
    AlphaTuner,
    Objective,
    tail_scores,
)
from jenga_sglang.radix.cache import PrefixCache, ServeResult

log = logging.getLogger(__name__)

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

    def _observe(self, cache: PrefixCache, request: Recorded, served: ServeResult | None) -> None:
        if self._done:
            return
        if self.from_start:
            self._observe_from_start(cache, request, served)
            return
        if self._snap is None:
            cache.eviction.alpha = 0.0
            if self._evicted(cache):
                self._snap = self._snapshot(cache)
                self._window_len = self.seen
            return
        self._window.append(request)
        self._served.append(served)
        if len(self._window) >= self._window_len:
            self._finish(cache, self._snap)

    def _observe_from_start(
        self, cache: PrefixCache, request: Recorded, served: ServeResult | None
    ) -> None:
        if self._snap is None:  # the first request: the replays start after it
            cache.eviction.alpha = 0.0
            self._snap = self._snapshot(cache)
        else:
            self._window.append(request)
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
             |<------- first window -------->|<-- pause -->|<- window ->|<-- pause x 2 --> ...
             snap  tune tune  tune      tune  tune          snap  record tune (same alpha)
                   32   64    128  ...  window

    The first window starts at the first eviction (before it every alpha behaves the same).
    It is tuned as it grows, at `first`, 2 x `first`, ... requests and at its full length, each
    time replaying all of it from its snapshot: the first decision then comes `first` requests
    after the first eviction instead of a whole window later, which on a trace of a few hundred
    requests is most of the run, and each later decision rests on twice the evidence of the one
    before. Later windows are tuned once, at their end. After each window the tuner pauses;
    when the window ends on the alpha the previous one ended on (the first: on the alpha it
    started with), the pause doubles (up to `max_pause`), so a stable workload is re-checked
    ever more rarely, and a change resets it to `pause`. Stability is judged window to window:
    what the first window tried while it grew is not a choice confirmed by a second window.
    Replay cost is len(grid) x window per window (the first: 32 + 64 + 128 + 256 + 300 = 2.6
    windows at the defaults, once, whatever the stream's length), not len(grid) x the whole
    stream.

    The grid stops at alpha = 1: beyond it the FLOP-efficiency term can outweigh the whole
    recency range, so a node that is never hit again can outlive every recently used one, and
    on chat windows such alphas win the window and lose the stream (a grid to 2 cost ShareGPT
    at 1 session/s and 2 GB 0.006 of its hit rate). Alphas past 1 (`beyond`) are replayed only
    when every alpha of the grid scores the same on the window (`widened_scores`): recency at
    any weight then finds the same hits, as when prefixes come back in a cycle longer than
    the cache holds, and only an order that lets efficiency outrank recency keeps some of them
    long enough to be hit. One of them is adopted only if it scores strictly higher.
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
        first: int = 32,
        beyond: Sequence[float] = BEYOND_GRID,
    ) -> None:
        super().__init__(grid, runner, objective, background, beyond)
        if window < 1 or not 0 <= pause <= max_pause or first < 1:
            raise ValueError(
                "need window >= 1, first >= 1 and 0 <= pause <= max_pause: "
                f"{window}, {first}, {pause}, {max_pause}"
            )
        self.window = window
        self.first = first
        self.base_pause = pause
        self.max_pause = max_pause
        self.pause = pause
        self._wait = 0
        self._snap: bytes | None = None
        self._recorded: list[Recorded] = []
        self._served: list[ServeResult | None] = []
        self._check = window  # the window's length at its next tuning
        self._windows = 0  # windows started
        self._closing = False  # the tuning in flight is its window's last
        self._steady = True  # one alpha served the whole window so far
        self._settled = 0.0  # the alpha the last window ended on

    def _observe(self, cache: PrefixCache, request: Recorded, served: ServeResult | None) -> None:
        if self._snap is not None:
            self._recorded.append(request)
            self._served.append(served)
            if len(self._recorded) >= self._check and not self.busy:
                self._tune_window(cache, self._snap)
        elif self._wait > 0:
            self._wait -= 1
        elif self._evicted(cache) and not self.busy:
            if self._windows == 0:
                self._settled = cache.eviction.alpha
            self._snap = self._snapshot(cache)
            self._steady = True
            self._check = min(self.first, self.window) if self._windows == 0 else self.window
            self._windows += 1

    def _tune_window(self, cache: PrefixCache, snap: bytes) -> None:
        """Tune on the window so far; close it at its full length, else wait for it to double.
        The served results score the alpha in force only if that alpha served all of them."""
        recorded = list(self._recorded)
        served = list(self._served) if self._steady else []
        self._closing = len(recorded) >= self.window
        if self._closing:
            self._snap, self._recorded, self._served = None, [], []
        else:
            self._check = min(2 * self._check, self.window)
        self._tune(cache, snap, recorded, served)

    def _tuned(self, cache: PrefixCache, tuned: bool, before: float) -> None:
        if cache.eviction.alpha != before:
            self._steady = False
        if self._closing:
            stable = tuned and cache.eviction.alpha == self._settled
            self._settled = cache.eviction.alpha
            self.pause = min(self.max_pause, self.pause * 2) if stable else self.base_pause
            self._wait = self.pause
