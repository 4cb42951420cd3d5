"""`marconi` tunes as the reference does (github ruipeterpan/marconi), checked against an
independent re-enactment of its procedure on a hand-built trace.

The reference's procedure, stated here without the tuner's code: alpha = 0; N = requests seen
when the cache first evicts; at request m x N, replay every request so far from an empty cache
once per alpha, score each by the FLOPs saved over the replay's last `tail` requests, and adopt
the best (ties: smallest alpha here). A cache that serves the stream with alpha fixed from the
start *is* that replay, so the re-enactment needs no snapshot at all.
"""

from __future__ import annotations

import pytest
from radix_helpers import hybrid_spec, make_cache, seq, toks

from jenga_sglang.policies.admission import SpeculativeAdmission
from jenga_sglang.policies.bundles import build_cache, byte_budget
from jenga_sglang.policies.reference_eviction import MarconiEviction
from jenga_sglang.policies.tuners import MarconiTuner
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.tokens import TokenSeq

GRID = (0.0, 0.5, 1.0, 2.0)
BUDGET = 2500


def mixed_trace() -> list[tuple[TokenSeq, TokenSeq]]:
    """Short chat sessions (three open at a time, lengths varying) interleaved with one-shot
    prompts under a shared system prompt: long histories and short branches differ in FLOP
    efficiency, so alphas disagree once the cache is full."""
    out: list[tuple[TokenSeq, TokenSeq]] = []
    system = list(range(1, 41))
    for t in range(36):
        for slot in range(3):
            s = 3 * (t // 4) + slot  # each session lives four rounds
            turn = t % 4
            base = 50_000 * (s + 1)
            history = [base]
            for k in range(turn + 1):
                user = [base + 200 * k + j for j in range(1, 4 + 4 * slot + s % 3)]
                reply = [base + 200 * k + 100 + j for j in range(2 + slot)]
                if k == turn:
                    out.append((TokenSeq.of(history + user), TokenSeq.of(reply)))
                history += user + reply
        one_shot = [900_000 + 100 * t + j for j in range(1, 3 + t % 5)]
        out.append((TokenSeq.of(system + one_shot), TokenSeq.of([7, 8, 9])))
    return out


def _fixed_alpha_run(trace, alpha):  # type: ignore[no-untyped-def]
    spec = hybrid_spec()
    cache = PrefixCache(
        spec, byte_budget(spec, BUDGET), MarconiEviction(alpha), SpeculativeAdmission(), False
    )
    saved, first_eviction = [], 0
    for i, (inp, out) in enumerate(trace):
        saved.append(cache.serve(inp, out, owner=i).flops_saved)
        if not first_eviction and cache.tree.evicted_nodes + cache.tree.evicted_states:
            first_eviction = i + 1
    return saved, first_eviction


def reference_pick(trace, multiplier, tail):  # type: ignore[no-untyped-def]
    """(request count at tuning, scores per alpha, alpha the reference's procedure adopts)."""
    _, n = _fixed_alpha_run(trace, 0.0)
    at = multiplier * n
    assert n > 0 and at <= len(trace), "the trace must evict and reach the tuning point"
    scores = [sum(_fixed_alpha_run(trace[:at], a)[0][max(0, at - tail) :]) for a in GRID]
    best = max(range(len(GRID)), key=lambda i: (scores[i], -GRID[i]))
    return at, scores, GRID[best]


def tuned(trace, **kwargs):  # type: ignore[no-untyped-def]
    spec = hybrid_spec()
    cache = PrefixCache(
        spec, byte_budget(spec, BUDGET), MarconiEviction(), SpeculativeAdmission(), False
    )
    tuner = MarconiTuner(grid=GRID, **kwargs)
    for i, (inp, out) in enumerate(trace):
        served = cache.serve(inp, out, owner=i)
        tuner.after_request(cache, inp, out, served)
    cache.check_integrity()
    return tuner.log.history


@pytest.mark.parametrize(("multiplier", "tail"), [(5, 500), (3, 500), (3, 8)])
def test_marconi_adopts_the_alpha_the_reference_procedure_picks(multiplier: int, tail: int):
    trace = mixed_trace()
    at, scores, pick = reference_pick(trace, multiplier, tail)
    assert len(set(scores)) > 1, f"alphas tie on this trace: {scores}"  # the check can fail
    assert tuned(trace, multiplier=multiplier, scored_tail=tail) == [(at, pick)]


def test_marconi_eviction_runs_on_the_reference_clock():
    """Stamps follow the reference's ticks, worked out here: each request ticks 3 times
    (lookup, insert, the insert's walk of the sequence) plus once if it evicts; the hit node and
    the nodes the request creates take the third tick, or the fourth once it evicted. (A clock
    of one tick per request gives other ages and, under 1 / age, other victims.)"""
    policy = MarconiEviction(alpha=1.0)
    cache = make_cache(hybrid_spec(), budget=BUDGET, eviction=policy)
    expected: dict[int, tuple[int, int]] = {}  # node id -> (stamp, start when stamped)
    clock, exact, evicting = 0, 0, 0
    for i, (inp, out) in enumerate(mixed_trace()):
        before = {n.id for n in cache.tree.nodes()}
        evicted = cache.tree.evicted_nodes + cache.tree.evicted_states
        hit_path = cache.tree.match(inp).path
        cache.serve(inp, out, owner=i)
        evicts = cache.tree.evicted_nodes + cache.tree.evicted_states > evicted
        evicting += evicts
        if hit_path:
            expected[hit_path[-1].id] = (clock + 3, hit_path[-1].start)
        live = {n.id: n for n in cache.tree.nodes() if n.parent is not None}
        for node in live.values():
            if node.id not in before:
                expected[node.id] = (clock + 3 + evicts, node.start)
        clock += 3 + evicts
        for node_id, (stamp, start) in expected.items():
            node = live.get(node_id)
            if node is None:
                continue
            if node.start < start:  # it absorbed an evicted parent: keeps the later stamp
                assert policy.stamp(node) >= stamp
            else:
                assert policy.stamp(node) == stamp, (i, node)
                exact += 1
    assert evicting > 10 and exact > 100, (evicting, exact)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0, 2.0])
def test_marconi_eviction_victim_is_the_reference_formula_argmin(alpha: float):
    """The victim is the argmin, over every candidate, of the reference's utility computed here
    from scratch: min-max(1 / (now - stamp)) + alpha * min-max(FLOPs the node's tokens save /
    bytes of one state plus the KV of every token from the root to the node's end)."""
    policy = MarconiEviction(alpha=alpha)
    spec = hybrid_spec()
    cache = make_cache(spec, budget=10**7, eviction=policy)
    for i in range(80):
        start = 1000 * (i % 9)
        cache.serve(TokenSeq.of(list(range(start, start + 3 + (i * 7) % 23))), toks(i), owner=i)

    def norm(values: list[float]) -> list[float]:
        lo, hi = min(values), max(values)
        return [(v - lo) / (hi - lo) if hi > lo else 1.0 for v in values]

    def path_efficiency(node) -> float:  # type: ignore[no-untyped-def]
        path_bytes = spec.state_bytes + spec.kv_bytes_per_token * node.end
        return (spec.flops(node.end) - spec.flops(node.start)) / path_bytes

    differs = 0
    for _ in range(40):
        candidates = [n for n in cache.tree.nodes() if policy.is_candidate(n)]
        victim = policy.victim()  # the eviction call ticks the clock once per request
        now = policy.now()
        recency = norm([1.0 / (now - policy.stamp(n)) for n in candidates])
        eff = norm([path_efficiency(n) for n in candidates])
        u = [r + alpha * e for r, e in zip(recency, eff, strict=True)]
        best = min(range(len(candidates)), key=lambda i: (u[i], candidates[i].id))
        assert victim is candidates[best]
        linear = norm([float(n.last_access) for n in candidates])
        lin_u = [r + alpha * e for r, e in zip(linear, eff, strict=True)]
        differs += min(range(len(candidates)), key=lambda i: (lin_u[i], candidates[i].id)) != best
        cache.tree.evict_for(cache.tree.kv_types[0])
    cache.check_integrity()
    if alpha >= 1.0:
        assert differs > 0, "the reciprocal term never changed a victim: the test shows nothing"


@pytest.mark.parametrize("lock_prefix", [True, False])
def test_an_insert_may_evict_its_own_prefix_as_the_reference_does(lock_prefix: bool):
    """The reference evicts before it inserts, with every node a candidate: a request whose
    prefix lies inside the only cached sequence evicts that sequence and caches itself whole,
    with one state (the branch point it would have split is gone). Locked (a real engine's
    rule), the prefix cannot go and the request does not fit. 16 bytes a token, 80 a state."""
    spec = hybrid_spec()
    cache = PrefixCache(
        spec, byte_budget(spec, 1000), MarconiEviction(1.0), SpeculativeAdmission(), lock_prefix
    )
    a_in, a_out = TokenSeq.of(list(range(1, 31))), TokenSeq.of(list(range(31, 41)))
    assert cache.serve(a_in, a_out, owner=0).cached  # 40 tokens + 1 state = 720 bytes
    b_in = TokenSeq.of(list(range(1, 21)) + list(range(500, 520)))
    b_out = TokenSeq.of(list(range(600, 610)))
    served = cache.serve(b_in, b_out, owner=1)
    assert served.hit_tokens == 0  # no state inside A's edge
    cache.check_integrity()
    if lock_prefix:
        assert not served.cached
        assert cache.tree.walk(a_in.concat(a_out)).length == 40
        return
    assert served.cached
    assert cache.tree.walk(b_in.concat(b_out)).length == 50
    assert cache.tree.walk(a_in.concat(a_out)).length == 20  # only what B shares
    states = [n for n in cache.tree.nodes() if n.state is not None]
    assert [n.end for n in states] == [50]


def _reference_cache(
    budget: int, alpha: float = 1.0, on_sequence: bool = True
) -> tuple[PrefixCache, MarconiEviction]:
    """A cache deciding as the reference simulator: Marconi's eviction, the prefix unlocked,
    and (`on_sequence`, bundle `marconi-faithful`) the branch of input + output."""
    spec = hybrid_spec()
    policy = MarconiEviction(alpha)
    admission = SpeculativeAdmission(on_sequence=on_sequence)
    return PrefixCache(spec, byte_budget(spec, budget), policy, admission, False), policy


def _states(cache: PrefixCache) -> list[int]:
    return sorted(n.end for n in cache.tree.nodes() if n.state is not None)


@pytest.mark.parametrize("on_sequence", [True, False])
def test_the_branch_checkpoint_is_where_input_and_output_leave_the_tree(on_sequence: bool):
    """Row 17 of policies/README.md. The reference inserts input + output in one piece and
    splits where that leaves the tree, in the output too, and takes no branch state when the
    whole sequence is cached to a node end; `marconi` checkpoints where the input leaves."""
    cache, _ = _reference_cache(10**6, on_sequence=on_sequence)
    cache.serve(seq(1, 10), seq(11, 10), owner=0)  # tokens 1..20: a state at 20
    second = cache.serve(seq(1, 5), TokenSeq.of([*range(6, 16), 99]), owner=1)
    assert second.hit_tokens == 0
    # input 1..5 leaves inside the edge at 5; input + output at 15, in the output
    assert _states(cache) == ([15, 16, 20] if on_sequence else [5, 16, 20])
    cache.serve(seq(1, 8), seq(9, 12), owner=2)  # the whole of 1..20 again, a node end
    assert _states(cache) == ([15, 16, 20] if on_sequence else [5, 8, 16, 20])
    cache.check_integrity()


def test_the_insert_makes_room_for_a_leaf_state_it_does_not_store():
    """The reference sizes an insert as its new KV plus one state for the leaf and one more
    when it splits an edge, even when the sequence ends inside that edge and stores only the
    split's state: with the cache nearly full, it evicts for the second. 16 bytes a token,
    80 a state: 400 + 2 x 80 > 500, while the one state stored would have fit (480)."""
    cache, _ = _reference_cache(500)
    assert cache.serve(seq(1, 10), seq(11, 10), owner=0).cached  # 20 x 16 + 80 = 400 bytes
    inside = cache.serve(seq(1, 10), seq(11, 5), owner=1)  # 1..15: ends inside 1..20's edge
    assert inside.cached and cache.tree.evicted_nodes == 1
    assert _states(cache) == [15] and cache.tree.walk(seq(1, 20)).length == 15
    cache.check_integrity()


def test_the_output_walk_refreshes_the_deepest_node_it_matches_whole():
    """Row 15: the lookup stamps the deepest node the input matches at the request's first
    tick; the insert's walk of input + output stamps the deepest node it matches whole at
    the third. Three ticks a request, no eviction: the third request's ticks are 7, 8, 9."""
    cache, policy = _reference_cache(10**6)
    cache.serve(seq(1, 10), seq(11, 10), owner=0)
    cache.serve(TokenSeq.of([*range(1, 11), 77]), toks(78), owner=1)  # split at 10
    cache.serve(seq(1, 10), TokenSeq.of([*range(11, 21), 50]), owner=2)
    by_end = {(n.start, n.end): n for n in cache.tree.nodes()}
    assert policy.stamp(by_end[(0, 10)]) == 7  # the input's hit: the lookup's tick
    assert policy.stamp(by_end[(10, 20)]) == 9  # the output's walk: the insert walk's tick
    cache.check_integrity()


@pytest.mark.parametrize("on_sequence", [True, False])
def test_a_merge_of_the_node_the_key_leaves_at_is_split_again_with_a_state(on_sequence: bool):
    """The insert's eviction may merge the node where the key leaves the tree into its only
    child: the key then leaves inside an edge, and the reference splits it there with a
    state. The plan is redone for that shape (not only for a shorter walk), and the state at
    the request's hit, taken by the merge, is stored again. With alpha 50 efficiency orders
    the victims: the short branch (5, 7), then the root node (0, 5), merged into (5, 15), then
    the unrelated 7-token sequence, which the merge's extra split state makes room for."""
    cache, _ = _reference_cache(720, alpha=50.0, on_sequence=on_sequence)
    cache.serve(seq(200, 5), toks(205, 206), owner=0)
    cache.serve(seq(1, 5), seq(6, 10), owner=1)
    cache.serve(TokenSeq.of([1, 2, 3, 4, 5, 20]), toks(21), owner=2)  # states at 5, 7, 15
    assert cache.tree.evicted_nodes == 0
    served = cache.serve(TokenSeq.of([1, 2, 3, 4, 5, *range(30, 35)]), seq(35, 5), owner=3)
    assert served.cached and served.hit_tokens == 5
    assert cache.tree.walk(seq(200, 7)).length == 0  # the unrelated sequence went
    ends = sorted((n.start, n.end, n.state is not None) for n in cache.tree.nodes())
    assert ends == [(0, 5, True), (5, 15, True), (5, 15, True)]
    cache.check_integrity()


def test_a_cache_refuses_to_plan_on_the_sequence_without_its_walk() -> None:
    """An engine or a server admits before the output exists: refused, not planned on the
    input unsaid."""
    spec = hybrid_spec()
    cache = PrefixCache(
        spec, byte_budget(spec, 10**6), MarconiEviction(), SpeculativeAdmission(on_sequence=True)
    )
    ids = TokenSeq.of([1, 2, 3])
    with pytest.raises(ValueError, match="only sequential serving knows the output"):
        cache.admit(ids, cache.lookup(ids), 5)  # an engine's or a server's admission
    assert cache.serve(ids, TokenSeq.of([4, 5]), owner=0).cached  # sequential: planned


def test_sglang_lru_faithful_refreshes_the_node_the_output_leaves_inside():
    """The reference's SGLang+ refreshes every node its insert's walk of input + output
    reaches before it evicts, the one it leaves inside an edge included: here the older
    sequence, whose edge the new one splits, outlives a newer one. 16 bytes a token, 80 a
    state: 400 + 256 cached, the split needs 16 + 2 x 80 more, one of the two must go."""
    spec = hybrid_spec()
    cache, _ = build_cache("sglang-lru-faithful", spec, byte_budget(spec, 700))
    cache.serve(seq(1, 10), seq(11, 10), owner=0)  # A: 1..20, the older
    cache.serve(seq(100, 6), seq(106, 5), owner=1)  # B: 100..110
    served = cache.serve(seq(1, 5), TokenSeq.of([*range(6, 13), 99]), owner=2)
    assert served.cached and cache.tree.evicted_nodes == 1
    assert cache.tree.walk(seq(1, 20)).length == 20  # A stays, split at 12
    assert cache.tree.walk(seq(100, 11)).length == 0  # B went
    assert _states(cache) == [12, 13, 20]
    cache.check_integrity()
