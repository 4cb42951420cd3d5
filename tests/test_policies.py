"""Policies on small hand-built trees: who goes first and why, refresh rules, branch positions."""

from __future__ import annotations

import random

import pytest
from radix_helpers import hybrid_spec, make_cache, node_at, seq, toks

from jenga_sglang.policies.admission import (
    EveryBlockAdmission,
    LeafOnlyAdmission,
    SpeculativeAdmission,
)
from jenga_sglang.policies.bundles import build_cache, build_policies, byte_budget
from jenga_sglang.policies.eviction import FlopAwareEviction, JengaEviction, LruEviction
from jenga_sglang.policies.registry import BUNDLES, bundle
from jenga_sglang.policies.replay_grid import GridRunner, run_grid_inline
from jenga_sglang.policies.tuners import MarconiTuner, SlidingTuner
from jenga_sglang.policies.tuning import AlphaTuner, Objective
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.contracts import Branch
from jenga_sglang.radix.tokens import TokenSeq

# ---------------------------------------------------------------- admission


@pytest.mark.parametrize(
    ("branch", "hit", "expected_prefill"),
    [
        (Branch(0, True, True), 0, ()),  # nothing shared: no branch checkpoint
        (Branch(37, False, False), 0, (37,)),  # leaves mid-edge at 37: checkpoint exactly there
        (Branch(37, True, False), 0, (37,)),  # node end without a state: checkpoint it
        (Branch(37, True, True), 37, ()),  # already checkpointed there
        (Branch(50, False, False), 50, ()),  # at or below the hit nothing is recomputed
        (Branch(60, False, False), 0, (60,)),  # the whole 60-token input is in the tree
    ],
)
def test_speculative_admission_plans_exact_branch_positions(branch, hit, expected_prefill):  # type: ignore[no-untyped-def]
    plan = SpeculativeAdmission().plan(branch, input_len=60, total_len=90, hit_len=hit)
    assert plan.prefill_at == expected_prefill
    assert plan.finish_at == (90,)
    assert plan.cache_len == 90
    assert len(plan.positions) <= 2


@pytest.mark.parametrize(
    ("branch", "expected"),
    [
        (Branch(9, False, False), ()),  # short, mid-edge: only a second occurrence
        (Branch(9, True, False, fanout=1), ()),  # short, one continuation so far
        (Branch(9, True, False, fanout=2), (9,)),  # short but popular: a third continuation
        (Branch(10, False, False), (10,)),  # long enough
    ],
)
def test_short_branches_are_checkpointed_only_where_popular(branch, expected):  # type: ignore[no-untyped-def]
    admission = SpeculativeAdmission(min_branch_tokens=10, short_branch_fanout=2)
    assert admission.plan(branch, 60, 90, 0).prefill_at == expected


@pytest.mark.parametrize(
    ("branch", "hit", "expected_prefill"),
    [
        (Branch(37, False, False), 0, (37, 60)),  # the branch point, then the prompt end
        (Branch(0, True, True), 0, (60,)),  # nothing shared: the prompt end alone
        (Branch(60, True, True), 59, ()),  # the prompt end is checkpointed already
        (Branch(60, False, False), 0, (60,)),  # the whole input is in the tree: one state there
    ],
)
def test_prompt_end_adds_the_state_after_the_whole_input(branch, hit, expected_prefill):  # type: ignore[no-untyped-def]
    admission = SpeculativeAdmission(prompt_end=True)
    plan = admission.plan(branch, input_len=60, total_len=90, hit_len=hit)
    assert plan.prefill_at == expected_prefill
    assert plan.finish_at == (90,)


def test_prompt_end_is_left_to_the_finish_state_when_nothing_is_decoded():
    plan = SpeculativeAdmission(prompt_end=True).plan(Branch(37, False, False), 60, 60, 0)
    assert (plan.prefill_at, plan.finish_at) == ((37,), (60,))


def test_prompt_end_state_lets_a_re_rendered_reply_resume_at_the_prompt():
    """The next turn repeats the prompt but not the reply as generated (a chat template
    re-renders it): only the prompt-end state is on the next turn's path."""
    spec = hybrid_spec()
    turn2 = seq(0, 30).concat(toks(700, 701, 702))  # reply re-rendered as 700..702
    plain = make_cache(spec)
    plain.serve(seq(0, 30), toks(900, 901), owner=1)
    assert plain.serve(turn2, toks(903), owner=2).hit_tokens == 0
    with_end = make_cache(spec, admission=SpeculativeAdmission(prompt_end=True))
    with_end.serve(seq(0, 30), toks(900, 901), owner=1)
    assert with_end.serve(turn2, toks(903), owner=2).hit_tokens == 30
    with_end.check_integrity()


def test_every_block_checkpoints_whole_blocks_only():
    plan = EveryBlockAdmission(32).plan(
        Branch(0, True, True), input_len=70, total_len=100, hit_len=32
    )
    assert plan.prefill_at == (64,)
    assert plan.finish_at == (96,)
    assert plan.cache_len == 96
    assert LeafOnlyAdmission().plan(Branch(5, False, False), 10, 12, 0).positions == (12,)


def test_speculative_checkpoint_lands_exactly_at_the_branch_point():
    cache = make_cache(hybrid_spec())
    cache.serve(seq(0, 20), toks(900), owner=1)
    second = seq(0, 13).concat(toks(500, 501, 502))
    result = cache.serve(second, toks(901), owner=2)
    assert result.hit_tokens == 0  # the branch at 13 is only discovered now
    node = cache.tree.match(seq(0, 13).concat(toks(777))).node
    assert node is not None and node.end == 13 and node.state is not None
    third = seq(0, 13).concat(toks(600))
    assert cache.serve(third, toks(902), owner=3).hit_tokens == 13  # third occurrence hits


# ---------------------------------------------------------------- eviction order


def three_sessions(eviction):  # type: ignore[no-untyped-def]
    """Three disjoint sessions; session 0 has two turns (its first turn's state is superseded)."""
    cache = make_cache(hybrid_spec(), eviction=eviction)
    cache.serve(toks(1, 2, 3, 4), toks(5, 6), owner=1)  # session 0, turn 0: state at 6
    cache.serve(toks(20, 21, 22, 23, 24, 25, 26, 27), toks(28), owner=2)  # session 1: state at 9
    cache.serve(toks(40, 41), toks(42), owner=3)  # session 2: state at 3
    cache.serve(toks(1, 2, 3, 4, 5, 6, 7, 8), toks(9), owner=4)  # session 0, turn 1: hits 6
    return cache


def test_lru_evicts_least_recent_leaf_and_a_hit_refreshes_the_whole_path():
    cache = three_sessions(LruEviction())
    superseded = node_at(cache, 1, 2, 3, 4, 5, 6)
    assert superseded.last_access == 4  # refreshed with its path by turn 1's hit
    victim = cache.eviction.victim()
    assert victim is node_at(cache, 20, 21, 22, 23, 24, 25, 26, 27, 28)  # session 1, oldest leaf
    assert not superseded.is_leaf  # LRU never evicts the one-child node holding a state


def test_flop_aware_refreshes_only_the_deepest_node_and_may_drop_a_one_child_state():
    cache = three_sessions(FlopAwareEviction(alpha=0.0))
    cache.serve(toks(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), toks(11), owner=5)  # turn 2: hits 9
    upper = node_at(cache, 1, 2, 3, 4, 5, 6)
    middle = node_at(cache, 1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert (upper.last_access, middle.last_access) == (4, 5)  # only the deepest hit moves
    order = []
    for _ in range(3):
        victim = cache.eviction.victim()
        order.append((victim.start, victim.end, victim.is_leaf))
        cache.tree.evict_for(cache.tree.kv_types[0])
        cache.check_integrity()
    # least recent first: session 1's leaf (t=2), session 2's leaf (t=3), then the one-child
    # node of session 0 (t=4), whose state is dropped while its child absorbs its tokens
    assert order == [(0, 9, True), (0, 3, True), (0, 6, False)]
    assert upper.parent is None
    assert middle.start == 0 and len(middle.kv[0]) == 9
    assert cache.tree.match(toks(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)).length == 11


def test_flop_aware_alpha_prefers_keeping_efficient_nodes():
    # Session 1's leaf is long (9 tokens, one state); session 2's is short (3 tokens, one
    # state): per byte it saves far fewer FLOPs. With a large alpha it goes first although
    # session 1 is older.
    cache = three_sessions(FlopAwareEviction(alpha=0.0))
    cache.tree.drop_state(node_at(cache, 1, 2, 3, 4, 5, 6))
    long_leaf = node_at(cache, 20, 21, 22, 23, 24, 25, 26, 27, 28)
    short_leaf = node_at(cache, 40, 41, 42)
    policy = cache.eviction
    assert isinstance(policy, FlopAwareEviction)
    assert policy.efficiency(long_leaf) > policy.efficiency(short_leaf)
    assert policy.victim() is long_leaf  # recency alone
    policy.alpha = 5.0
    assert policy.victim() is short_leaf


def test_jenga_eviction_drops_superseded_checkpoints_before_any_leaf():
    cache = three_sessions(JengaEviction(alpha=5.0))
    turn0_end = node_at(cache, 1, 2, 3, 4, 5, 6)
    policy = cache.eviction
    assert isinstance(policy, JengaEviction)
    # Turn 1 resumed from turn 0's checkpoint and went on below it: the session's next turn
    # resumes from turn 1's end, so turn 0's state is superseded.
    assert policy.is_superseded(turn0_end)
    assert policy.victim() is turn0_end  # before every leaf, whatever alpha says
    cache.tree.evict_for(cache.tree.kv_types[0])
    assert cache.tree.match(toks(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)).length == 9
    cache.check_integrity()


def test_a_fresh_branch_checkpoint_is_not_superseded_until_the_one_below_is_used():
    # Agent trajectories: request k+1 rewrites history inside request k's sequence, so the branch
    # point is checkpointed during k+1's prefill and is what request k+2 resumes from.
    cache = make_cache(hybrid_spec(), eviction=JengaEviction(alpha=0.0))
    cache.serve(seq(0, 20), toks(900), owner=1)  # request k
    cache.serve(seq(0, 12).concat(toks(500, 501, 502, 503)), toks(901), owner=2)  # k+1
    branch = node_at(cache, *range(12))
    policy = cache.eviction
    assert isinstance(policy, JengaEviction)
    assert branch.end == 12 and branch.state is not None
    dead = node_at(cache, *range(20), 900)  # request k's rest of history: never resumed
    cache.tree.evict_leaf(dead)
    assert len(branch.children) == 1 and not policy.is_superseded(branch)
    # k+2 resumes from the branch point and checkpoints its own branch point below it; the
    # branch point is a junction (two continuations were seen there), so that hit alone does
    # not tell the traffic has moved on
    cache.serve(seq(0, 12).concat(toks(500, 501, 777)), toks(902), owner=3)
    assert not policy.is_superseded(branch)
    # k+3 rewrites k+2's history past k+2's branch point and resumes from it: the deeper
    # checkpoint is in use
    cache.serve(seq(0, 12).concat(toks(500, 501, 888)), toks(903), owner=4)
    assert node_at(cache, *range(12), 500, 501).hit_count == 1
    assert policy.is_superseded(branch)
    cache.check_integrity()


def test_a_shared_prefix_keeps_its_state_when_one_tail_is_left():
    # generated-shared-prefix shape: requests resume from a shared prompt's branch state and go
    # on into questions nobody asks again. Once the other tails are gone the prompt has one
    # child, yet the next request of the group resumes from the prompt, not from that tail.
    cache = make_cache(hybrid_spec(), eviction=JengaEviction(alpha=0.0))
    for i, q in enumerate((50, 60, 70)):
        cache.serve(seq(0, 12).concat(toks(q, q + 1)), toks(q + 2), owner=i)
    prompt = node_at(cache, *range(12))
    policy = cache.eviction
    assert isinstance(policy, JengaEviction)
    assert prompt.state is not None and prompt.hit_count == 1  # the third request hit it
    for q in (60, 70):  # the newer tails go; the oldest one, older than the prompt's hit, stays
        cache.tree.evict_leaf(node_at(cache, *range(12), q, q + 1, q + 2))
    assert len(prompt.children) == 1 and not policy.is_superseded(prompt)
    (tail,) = prompt.children.values()
    assert tail.last_access < prompt.last_access
    assert policy.victim() is tail  # the stale tail goes before the prompt's state
    cache.check_integrity()


def test_jenga_eviction_drops_a_branch_state_but_keeps_the_branch():
    cache = make_cache(hybrid_spec(), eviction=JengaEviction(alpha=0.0))
    for i, tail in enumerate((50, 60, 70)):  # three continuations of one 5-token prefix
        cache.serve(seq(0, 5).concat(toks(tail, tail + 1)), toks(tail + 2), owner=i)
    junction = node_at(cache, 0, 1, 2, 3, 4)
    assert junction is not None and junction.state is not None and len(junction.children) == 3
    for leaf in [n for n in cache.tree.nodes() if n.is_leaf]:
        leaf.last_access = 100 + leaf.id  # make the junction the least recent candidate
        cache.eviction.update(leaf)
    assert cache.eviction.victim() is junction
    cache.tree.evict_for(cache.tree.kv_types[0])
    assert junction.state is None and junction.parent is not None  # branch and KV stay
    assert len(junction.children) == 3 and len(junction.kv[0]) == 5
    assert cache.tree.match(seq(0, 5).concat(toks(60, 61, 62, 9))).length == 8
    cache.check_integrity()


def test_marconi_with_a_fixed_alpha_is_a_bundle():
    b = build_policies(bundle("marconi@0.3"), hybrid_spec())
    assert b.tuner is None
    eviction = b.eviction
    assert isinstance(eviction, FlopAwareEviction) and eviction.alpha == 0.3
    with pytest.raises(ValueError, match="alpha"):
        bundle("marconi@x")
    with pytest.raises(ValueError, match="alpha"):
        bundle("marconi@-1")


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.7, 1.5, 4.0])
def test_threshold_victim_matches_a_full_scan_eviction_after_eviction(alpha: float):
    cache = make_cache(hybrid_spec(), budget=10**7, eviction=FlopAwareEviction(alpha=0.5))
    for i in range(80):
        start = 1000 * (i % 9)
        cache.serve(TokenSeq.of(list(range(start, start + 3 + (i * 7) % 23))), toks(i), owner=i)
    policy = cache.eviction
    assert isinstance(policy, FlopAwareEviction)
    policy.alpha = alpha
    for _ in range(40):
        candidates = [n for n in cache.tree.nodes() if policy.is_candidate(n)]
        best = min(candidates, key=lambda n: (policy.utility(n), n.id))
        assert policy.victim() is best
        cache.tree.evict_for(cache.tree.kv_types[0])
    cache.check_integrity()


# ---------------------------------------------------------------- tuning


def chat_trace(sessions: int, turns: int) -> list[tuple[TokenSeq, TokenSeq]]:
    out: list[tuple[TokenSeq, TokenSeq]] = []
    history = {s: [10_000 * (s + 1)] for s in range(sessions)}
    for t in range(turns):
        for s in range(sessions):
            user = [10_000 * (s + 1) + 100 * t + k for k in range(1, 6 + (s * t) % 7)]
            reply = [10_000 * (s + 1) + 100 * t + 50 + k for k in range(3 + s % 4)]
            out.append((TokenSeq.of(history[s] + user), TokenSeq.of(reply)))
            history[s] += user + reply
    return out


def serve_all(cache, tuner, trace):  # type: ignore[no-untyped-def]
    hits = 0
    for i, (inp, out) in enumerate(trace):
        hits += cache.serve(inp, out, owner=i).hit_tokens
        if tuner is not None:
            tuner.after_request(cache, inp, out)
    return hits


def test_marconi_tuner_waits_for_first_eviction_then_tunes_once():
    spec = hybrid_spec()
    cache = PrefixCache(spec, byte_budget(spec, 1200), FlopAwareEviction(), SpeculativeAdmission())
    tuner = MarconiTuner(grid=(0.0, 0.5, 1.0))
    serve_all(cache, tuner, chat_trace(6, 8))
    assert tuner.log.tunings == 1 and tuner.log.failures == 0
    first_request_after_tuning = tuner.log.history[0][0]
    assert first_request_after_tuning > 1
    cache.check_integrity()


def test_tuner_failure_keeps_last_alpha_and_the_cache_keeps_working():
    spec = hybrid_spec()

    def broken_runner(snap, window, grid):  # type: ignore[no-untyped-def]
        raise RuntimeError("worker killed")

    cache = PrefixCache(spec, byte_budget(spec, 1200), JengaEviction(0.5), SpeculativeAdmission())
    tuner = SlidingTuner(window=5, pause=3, runner=broken_runner)
    hits = serve_all(cache, tuner, chat_trace(6, 8))
    assert tuner.log.failures >= 2 and tuner.log.tunings == 0
    assert cache.eviction.alpha == 0.5
    assert hits > 0
    cache.check_integrity()


def test_sliding_tuner_retunes_and_backs_off_when_stable():
    spec = hybrid_spec()
    cache = PrefixCache(spec, byte_budget(spec, 1200), JengaEviction(), SpeculativeAdmission())
    tuner = SlidingTuner(window=4, pause=2, max_pause=8, objective=Objective.TOKENS)
    serve_all(cache, tuner, chat_trace(6, 10))
    assert tuner.log.tunings >= 3
    assert all(a in tuner.grid for _, a in tuner.log.history)
    gaps = [b - a for (a, _), (b, _) in zip(tuner.log.history, tuner.log.history[1:], strict=False)]
    assert max(gaps) > min(gaps) or len(set(a for _, a in tuner.log.history)) > 1


def shared_prompt_trace(requests: int) -> list[tuple[TokenSeq, TokenSeq]]:
    """Generated-shared-prefix in small: every other request asks one of three 100-token
    prompts a new question, the others are one-off inputs of 20-40 tokens. Keeping the prompts
    (alpha 1: long, deep, FLOP-dense) beats keeping what came last (alpha 0)."""
    rng = random.Random(0)
    out = []
    for i in range(requests):
        if i % 2 == 0:
            group = rng.randrange(3) + 1
            prompt = [100_000 * group + k for k in range(100)]
            inp = prompt + [900_000 + 50 * i + k for k in range(8)]
        else:
            inp = [2_000_000 + 100 * i + k for k in range(rng.randint(20, 40))]
        out.append((TokenSeq.of(inp), TokenSeq.of([800_000 + i])))
    return out


def _first_eviction(cache: PrefixCache, trace: list[tuple[TokenSeq, TokenSeq]]) -> int:
    """Serve `trace` with no tuner; the number of requests seen at the first eviction."""
    for i, (inp, out) in enumerate(trace):
        cache.serve(inp, out, owner=i)
        if cache.evicted_nodes + cache.evicted_states:
            return i + 1
    raise AssertionError("no eviction")


def test_sliding_tuner_decides_early_on_a_trace_shorter_than_its_window():
    """A 200-request trace ends before a 300-request window does: the tuner decides on the
    first window as it grows (32 requests after the first eviction, then 64, 128), so the
    trace runs at the better alpha for most of its length instead of at 0 throughout."""
    spec = hybrid_spec()
    trace = shared_prompt_trace(200)

    def cache(alpha: float = 0.0) -> PrefixCache:
        eviction = JengaEviction(alpha)
        return PrefixCache(spec, byte_budget(spec, 5000), eviction, SpeculativeAdmission())

    recency, flops = serve_all(cache(0.0), None, trace), serve_all(cache(1.0), None, trace)
    assert flops > 1.3 * recency  # the workload rewards FLOP awareness
    evicted_at = _first_eviction(cache(), trace)
    tuner = SlidingTuner()  # the `jenga` bundle's: window 300, first decision at 32
    tuned = serve_all(cache(), tuner, trace)
    assert [seen for seen, _ in tuner.log.history] == [evicted_at + n for n in (32, 64, 128)]
    assert tuner.log.history[0][1] == 1.0
    assert tuned > recency + 0.5 * (flops - recency)


def test_first_window_is_replayed_whole_from_one_snapshot_as_it_doubles():
    """The first window's tunings replay it from its start at 2, 4, 8 and 16 requests; later
    windows are tuned once, at their full length, from their own snapshot."""
    spec = hybrid_spec()
    replays: list[tuple[bytes, int]] = []

    def recording_runner(snap, window, grid):  # type: ignore[no-untyped-def]
        replays.append((snap, len(window)))
        return run_grid_inline(snap, window, grid)

    cache = PrefixCache(spec, byte_budget(spec, 1200), JengaEviction(), SpeculativeAdmission())
    # the grid alone: replays past alpha 1 on flat windows would be counted too
    tuner = SlidingTuner(
        window=16, first=2, pause=4, max_pause=8, runner=recording_runner, beyond=()
    )
    serve_all(cache, tuner, chat_trace(6, 10))
    assert [n for _, n in replays[:4]] == [2, 4, 8, 16]
    assert len({snap for snap, _ in replays[:4]}) == 1
    assert [n for _, n in replays[4:]] == [16] * len(replays[4:]) and len(replays) > 4
    assert replays[4][0] != replays[0][0]


def test_pause_doubles_only_when_a_window_ends_on_the_alpha_the_last_one_ended_on():
    """Stability is judged window to window: the first window, which moved from alpha 0 to 1
    while it grew, is a change (pause 4); the second confirms it (pause 8)."""
    spec = hybrid_spec()

    def favours_one(snap, window, grid):  # type: ignore[no-untyped-def]
        return [(0.0, 100 if alpha == 1.0 else 0) for alpha in grid]

    cache = PrefixCache(spec, byte_budget(spec, 1200), JengaEviction(), SpeculativeAdmission())
    tuner = SlidingTuner(window=8, first=2, pause=4, max_pause=64, runner=favours_one)
    pauses = []
    for i, (inp, out) in enumerate(chat_trace(6, 10)):
        tunings = tuner.log.tunings
        cache.serve(inp, out, owner=i)
        tuner.after_request(cache, inp, out)  # no served results: every alpha is replayed
        if tuner.log.tunings > tunings and tuner._wait:
            pauses.append(tuner.pause)
    assert tuner.log.history[0][1] == 1.0  # adopted at the first, 2-request tuning
    assert pauses[:3] == [4, 8, 16]


@pytest.mark.parametrize("name", list(BUNDLES))
def test_bundles_are_deterministic_given_the_same_stream(name: str):
    """Two independent caches (as on two tensor-parallel ranks) make identical decisions."""
    spec = hybrid_spec()
    trace = chat_trace(5, 9)
    runs = []
    for _ in range(2):
        cache, tuner = build_cache(name, spec, byte_budget(spec, 1500))
        hits = [cache.serve(i, o, owner=k).hit_tokens for k, (i, o) in enumerate(trace)]
        if tuner is not None:
            for inp, out in trace:
                tuner.after_request(cache, inp, out)
        shape = sorted((n.start, n.end, n.state is not None) for n in cache.tree.nodes())
        runs.append((hits, shape, cache.eviction.alpha, cache.tree.evicted_nodes))
    assert runs[0] == runs[1]


def test_unknown_bundle_names_the_known_ones():
    with pytest.raises(ValueError, match="sglang-lru"):
        bundle("lfu")


def _marconi(grid: tuple[float, ...], runner: GridRunner) -> AlphaTuner:
    return MarconiTuner(grid=grid, runner=runner)


def _sliding(grid: tuple[float, ...], runner: GridRunner) -> AlphaTuner:
    # the grid alone: the test counts the replays of `grid` (past it: tests/test_tuner_widening)
    return SlidingTuner(window=4, pause=2, max_pause=8, grid=grid, runner=runner, beyond=())


@pytest.mark.parametrize("make_tuner", [_marconi, _sliding], ids=["marconi", "sliding"])
def test_served_window_scores_the_current_alpha_without_replaying_it(make_tuner):  # type: ignore[no-untyped-def]
    """A window the cache served itself is the replay of the alpha in force: passing the served
    results spares that replay and changes no decision."""
    spec = hybrid_spec()
    trace = chat_trace(6, 10)
    runs = []
    for pass_served in (False, True):
        asked: list[tuple[float, ...]] = []

        def counting_runner(snap, window, grid, asked=asked):  # type: ignore[no-untyped-def]
            asked.append(tuple(grid))
            return run_grid_inline(snap, window, grid)

        grid = (0.0, 0.5, 1.0)
        tuner = make_tuner(grid, counting_runner)
        cache = PrefixCache(spec, byte_budget(spec, 1200), JengaEviction(), SpeculativeAdmission())
        hits = []
        for i, (inp, out) in enumerate(trace):
            served = cache.serve(inp, out, owner=i)
            hits.append(served.hit_tokens)
            tuner.after_request(cache, inp, out, served if pass_served else None)
        runs.append((hits, tuner.log.history, asked))
    (hits_a, history_a, asked_a), (hits_b, history_b, asked_b) = runs
    assert tuner.log.tunings >= 1
    assert hits_a == hits_b and history_a == history_b
    assert all(len(full) == len(grid) for full in asked_a)
    assert all(len(short) == len(grid) - 1 for short in asked_b)
