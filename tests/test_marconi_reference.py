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
from radix_helpers import hybrid_spec, make_cache, toks

from jenga_sglang.policies.admission import SpeculativeAdmission
from jenga_sglang.policies.bundles import byte_budget
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
