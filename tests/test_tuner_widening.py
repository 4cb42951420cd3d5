"""The sliding tuner looks past alpha 1 only when its grid cannot tell its alphas apart."""

from __future__ import annotations

from collections.abc import Sequence

from radix_helpers import hybrid_spec

from jenga_sglang.policies.admission import SpeculativeAdmission
from jenga_sglang.policies.background import BackgroundReplay
from jenga_sglang.policies.bundles import byte_budget
from jenga_sglang.policies.eviction import JengaEviction
from jenga_sglang.policies.replay_grid import Recorded, Scores
from jenga_sglang.policies.tuners import SlidingTuner
from jenga_sglang.policies.tuning import BEYOND_GRID, JENGA_GRID, UNSCORED, widened_scores
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.tokens import TokenSeq

BUDGET = 6000  # bytes of hybrid_spec(): about two of the six articles


def articles_in_a_cycle(rounds: int = 12) -> list[tuple[TokenSeq, TokenSeq]]:
    """Six articles of 40-140 tokens, each asked a new question in turn, round after round: a
    cycle longer than the cache holds, where recency order finds no article still cached."""
    out = []
    for r in range(rounds):
        for d in range(6):
            article = [100_000 * (d + 1) + k for k in range(40 + 20 * d)]
            question = [5_000_000 + 1000 * r + 10 * d + k for k in range(6)]
            out.append((TokenSeq.of(article + question), TokenSeq.of([7_000_000 + 100 * r + d])))
    return out


def serve(alpha: float, tuner: SlidingTuner | None = None) -> int:
    spec = hybrid_spec()
    eviction = JengaEviction(alpha)
    cache = PrefixCache(spec, byte_budget(spec, BUDGET), eviction, SpeculativeAdmission())
    hits = 0
    for i, (inp, out) in enumerate(articles_in_a_cycle()):
        hits += cache.serve(inp, out, owner=i).hit_tokens
        if tuner is not None:
            tuner.after_request(cache, inp, out)
    cache.check_integrity()
    return hits


def test_a_cycle_longer_than_the_cache_is_won_only_past_alpha_1():
    """Where every alpha in [0, 1] finds the same hits, the tuner replays 1.25-2 as well and
    adopts one that scores higher; without them it stays at alpha 0 and finds nothing."""
    assert {serve(a) for a in JENGA_GRID} == {0}  # the premise: recency finds nothing here
    beyond = [serve(a) for a in BEYOND_GRID]
    assert min(beyond) > 0

    widened = SlidingTuner(window=24, first=6, pause=12)
    hits = serve(0.0, widened)
    assert widened.log.widened >= 1
    assert any(alpha in BEYOND_GRID for _, alpha in widened.log.history)
    assert hits > 0.5 * max(beyond)

    grid_only = SlidingTuner(window=24, first=6, pause=12, beyond=())
    assert serve(0.0, grid_only) == 0
    assert grid_only.log.widened == 0
    assert all(alpha in JENGA_GRID for _, alpha in grid_only.log.history)


def _runner(scores: dict[float, int], asked: list[tuple[float, ...]]):  # type: ignore[no-untyped-def]
    def run(snap: bytes, window: Sequence[Recorded], grid: Sequence[float]) -> Scores:
        asked.append(tuple(grid))
        return [(0.0, scores[a]) for a in grid]

    return run


def test_alphas_past_the_grid_are_replayed_only_on_a_flat_grid():
    window: list[Recorded] = [(TokenSeq.of([1, 2]), TokenSeq.of([3]), None)]
    beyond = (1.5, 2.0)
    asked: list[tuple[float, ...]] = []
    uneven = _runner({0.0: 5, 1.0: 7, 1.5: 99, 2.0: 99}, asked)
    scores = widened_scores(uneven, (0.0, 1.0), beyond, 1, 0.0, b"", window, [])
    assert asked == [(0.0, 1.0)]  # the grid tells its alphas apart: nothing more is replayed
    assert scores == [(0.0, 5), (0.0, 7), UNSCORED, UNSCORED]

    asked.clear()
    flat = _runner({0.0: 5, 1.0: 5, 1.5: 9, 2.0: 4}, asked)
    scores = widened_scores(flat, (0.0, 1.0), beyond, 1, 0.0, b"", window, [])
    assert asked == [(0.0, 1.0), beyond]
    assert scores == [(0.0, 5), (0.0, 5), (0.0, 9), (0.0, 4)]


def test_an_alpha_past_the_grid_is_kept_only_while_the_grid_stays_flat():
    """At alpha 1.5 a window whose grid is uneven moves the tuner back into the grid, even if
    1.5 would have scored higher: 1.5 is not replayed there, so it cannot be kept."""
    spec = hybrid_spec()
    cache = PrefixCache(spec, byte_budget(spec, BUDGET), JengaEviction(1.5), SpeculativeAdmission())
    asked: list[tuple[float, ...]] = []
    tuner = SlidingTuner(
        window=4, first=4, grid=(0.0, 1.0), beyond=(1.5,), runner=_runner({0.0: 1, 1.0: 2}, asked)
    )
    for i, (inp, out) in enumerate(articles_in_a_cycle(2)):
        cache.serve(inp, out, owner=i)
        tuner.after_request(cache, inp, out)
        if tuner.log.tunings:
            break
    assert asked == [(0.0, 1.0)]
    assert tuner.log.history[-1][1] == 1.0 and tuner.log.widened == 0


def test_the_server_s_background_worker_widens_as_inline_tuning_does():
    """The server tunes in a spawned worker process: the widened job pickles, and its first
    adoption past the grid is inline tuning's, `lag` requests later."""
    inline = SlidingTuner(window=24, first=6, pause=12)
    serve(0.0, inline)
    first_inline = next(h for h in inline.log.history if h[1] in BEYOND_GRID)

    lag = 2
    background = BackgroundReplay(lag)  # the server's worker: a spawned process
    tuner = SlidingTuner(window=24, first=6, pause=12, background=background)
    try:
        hits = serve(0.0, tuner)
    finally:
        background.close()
    assert tuner.log.failures == 0 and tuner.log.widened >= 1
    first = next(h for h in tuner.log.history if h[1] in BEYOND_GRID)
    assert first == (first_inline[0] + lag, first_inline[1])
    assert hits > 0
