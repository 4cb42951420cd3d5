"""Alpha tuning off the request path (policies/background.py): same choices, applied `lag`
requests later, and a worker that dies leaves the cache and its alpha alone."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from radix_helpers import hybrid_spec
from test_policies import chat_trace, serve_all

from jenga_sglang.policies.admission import SpeculativeAdmission
from jenga_sglang.policies.background import BackgroundReplay
from jenga_sglang.policies.bundles import byte_budget
from jenga_sglang.policies.eviction import JengaEviction
from jenga_sglang.policies.replay_grid import Recorded, Scores, run_grid_inline
from jenga_sglang.policies.tuners import SlidingTuner
from jenga_sglang.radix.cache import PrefixCache


def _cache() -> PrefixCache:
    spec = hybrid_spec()
    return PrefixCache(spec, byte_budget(spec, 1200), JengaEviction(), SpeculativeAdmission())


def _threaded(lag: int) -> BackgroundReplay:
    return BackgroundReplay(lag, executor_factory=lambda: ThreadPoolExecutor(max_workers=1))


def _exit_runner(snap: bytes, window: Sequence[Recorded], grid: Sequence[float]) -> Scores:
    os._exit(3)  # the worker process dies mid-replay (as if killed)


def test_background_tuning_picks_what_inline_tuning_picks_lag_requests_later() -> None:
    """Same replays, same choices: each adoption lands exactly `lag` requests after the
    window that asked for it (the tuner starts no window while one is in flight)."""
    trace = chat_trace(6, 10)
    inline = SlidingTuner(window=4, pause=2, max_pause=8)
    serve_all(_cache(), inline, trace)
    lag = 3
    background = SlidingTuner(window=4, pause=2, max_pause=8, background=_threaded(lag))
    cache = _cache()
    serve_all(cache, background, trace)
    assert inline.log.tunings >= 2 and background.log.tunings >= 2
    first_inline, first_background = inline.log.history[0], background.log.history[0]
    assert first_background == (first_inline[0] + lag, first_inline[1])
    cache.check_integrity()


def test_background_tuning_is_deterministic() -> None:
    """Two ranks with their own workers adopt the same alphas at the same requests."""
    runs = []
    for _ in range(2):
        tuner = SlidingTuner(window=4, pause=2, max_pause=8, background=_threaded(2))
        cache = _cache()
        hits = serve_all(cache, tuner, chat_trace(6, 10))
        runs.append((hits, tuner.log.history, cache.eviction.alpha))
    assert runs[0] == runs[1]


def test_a_growing_window_keeps_recording_while_its_replay_runs() -> None:
    """The first window is tuned as it grows; its requests that arrive while a replay is in
    flight still join it, so every replay covers consecutive requests from its snapshot on."""
    trace = chat_trace(6, 10)
    replayed: list[list[Recorded]] = []

    def recording_runner(snap: bytes, window: Sequence[Recorded], grid: Sequence[float]) -> Scores:
        replayed.append(list(window))
        return run_grid_inline(snap, window, grid)

    # the grid alone: a flat window's replays past alpha 1 would be recorded as a second window
    tuner = SlidingTuner(
        16, 4, first=2, runner=recording_runner, background=_threaded(3), beyond=()
    )
    serve_all(_cache(), tuner, trace)
    assert len(replayed) > 2 and max(map(len, replayed)) == 16
    inputs = [inp for inp, _ in trace]
    for window in replayed:
        start = next(i for i, inp in enumerate(inputs) if inp is window[0][0])
        assert [inp for inp, _, _ in window] == inputs[start : start + len(window)]
    first = [w for w in replayed if w[0][0] is replayed[0][0][0]]
    assert [len(w) for w in first] == [2, 5, 8, 16]  # 4 came while the first was in flight


def test_a_dead_worker_keeps_the_alpha_and_the_next_replay_gets_a_new_worker() -> None:
    cache = _cache()
    cache.eviction.alpha = 0.5
    tuner = SlidingTuner(window=4, pause=2, runner=_exit_runner, background=BackgroundReplay(2))
    hits = serve_all(cache, tuner, chat_trace(6, 10))
    assert tuner.log.failures >= 2 and tuner.log.tunings == 0  # each failure: a fresh worker
    assert cache.eviction.alpha == 0.5
    assert hits > 0
    cache.check_integrity()
    tuner.runner = run_grid_inline  # a working replay after the failures
    serve_all(cache, tuner, chat_trace(6, 10))
    assert tuner.log.tunings >= 1
    assert tuner.background is not None
    tuner.background.close()
