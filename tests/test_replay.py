"""Sequential replay on tiny hand-built traces, with hit tokens worked out by hand.

Model marconi-7b: one token of KV is 4 layers x 2 x 4096 x 2 bytes = 65536 bytes; one SSM
checkpoint is 24 x (4096*128*2 + (2*4096 + 2*128)*4*2) bytes. Policy sglang-lru (speculative
admission: a state after the last decoded token, and at a branch point inside the input).
"""

from __future__ import annotations

import pytest

from jenga_sglang.bench.simulation.replay import replay_sequential
from jenga_sglang.bench.traces.packed import PackedRequest, pack
from jenga_sglang.bench.traces.trace import Request
from jenga_sglang.models.presets import get_spec
from jenga_sglang.policies.bundles import build_cache, byte_budget
from jenga_sglang.radix.cache import PrefixCache

SPEC = get_spec("marconi-7b")
KV = SPEC.kv_bytes_per_token
STATE = SPEC.state_bytes


def _seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def two_sessions() -> list[PackedRequest]:
    """A0 (10 in, 4 out), B0 (10 in, 4 out, other tokens), A1 = A0's 14 tokens + 6 new."""
    a0_in, a0_out = _seq(1, 10), _seq(11, 4)
    return pack(
        [
            Request(0, 0, 0.0, a0_in, a0_out),
            Request(1, 0, 1.0, _seq(101, 10), _seq(111, 4)),
            Request(0, 1, 2.0, a0_in + a0_out + _seq(15, 6), _seq(21, 4)),
        ]
    )


def cache_of(policy: str, capacity: int) -> PrefixCache:
    cache, _ = build_cache(policy, SPEC, byte_budget(SPEC, capacity))
    return cache


def test_pack_converts_once_and_keeps_order() -> None:
    reqs = two_sessions()
    assert [len(r.inp) for r in reqs] == [10, 10, 20]
    assert reqs[2].inp.tolist()[:14] == reqs[0].inp.concat(reqs[0].out).tolist()
    assert [r.session_id for r in reqs] == [0, 1, 0]


def test_pack_rejects_negative_ids() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        pack([Request(0, 0, 0.0, [1, -2], [])])


def test_big_budget_one_session_grows_its_hit() -> None:
    """Three turns of one session: each input extends the last input + output.

    turn 0: 10 in, hit 0; caches 14 tokens, state at 14.
    turn 1: 20 in, hit 14 (state at 14); caches 24, state at 24.
    turn 2: 30 in, hit 24.  Hits 38 of 60 input tokens.
    """
    t0_in, t0_out = _seq(1, 10), _seq(11, 4)
    t1_in = t0_in + t0_out + _seq(15, 6)
    t1_out = _seq(21, 4)
    t2_in = t1_in + t1_out + _seq(25, 6)
    reqs = pack(
        [
            Request(0, 0, 0.0, t0_in, t0_out),
            Request(0, 1, 1.0, t1_in, t1_out),
            Request(0, 2, 2.0, t2_in, _seq(31, 4)),
        ]
    )
    stats = replay_sequential(reqs, cache_of("sglang-lru", 10**9), None, check=True)
    assert (stats.requests, stats.input_tokens, stats.hit_tokens) == (3, 60, 38)
    assert stats.token_hit_rate == pytest.approx(38 / 60)
    assert stats.flops_saved == pytest.approx(SPEC.flops(14) + SPEC.flops(24))
    assert stats.flops_total == pytest.approx(SPEC.flops(10) + SPEC.flops(20) + SPEC.flops(30))
    assert stats.uncached_requests == 0


def test_big_budget_second_turn_hits_its_session() -> None:
    stats = replay_sequential(two_sessions(), cache_of("sglang-lru", 10**9), None, check=True)
    assert stats.hit_tokens == 14  # A1 reuses A0's 14 tokens; A0 and B0 are cold
    assert stats.token_hit_rate == pytest.approx(14 / 40)


def test_budget_of_one_request_evicts_and_loses_the_hit() -> None:
    """Room for exactly one request (14 tokens + 1 state): B0's insert evicts A0 (LRU leaf),
    so A1 misses; A1 itself (24 tokens + state) does not fit and stays uncached."""
    cache = cache_of("sglang-lru", 14 * KV + STATE)
    stats = replay_sequential(two_sessions(), cache, None, check=True)
    assert stats.hit_tokens == 0
    assert stats.uncached_requests == 1
    assert cache.tree.evicted_nodes >= 1
    assert cache.memory.capacity_violations == 0  # type: ignore[attr-defined]


def test_budget_too_small_for_a_turn_keeps_the_old_entry() -> None:
    """Room for 24 tokens + 1 state: turn 1 needs 10 more tokens and a second state, which
    cannot be had while turn 0's node is locked, so it is not cached; turn 2 still hits 14."""
    t0_in, t0_out = _seq(1, 10), _seq(11, 4)
    t1_in = t0_in + t0_out + _seq(15, 6)
    t2_in = t1_in + _seq(21, 4) + _seq(25, 6)
    reqs = pack(
        [
            Request(0, 0, 0.0, t0_in, t0_out),
            Request(0, 1, 1.0, t1_in, _seq(21, 4)),
            Request(0, 2, 2.0, t2_in, _seq(31, 4)),
        ]
    )
    stats = replay_sequential(reqs, cache_of("sglang-lru", 24 * KV + STATE), None, check=True)
    assert stats.hit_tokens == 14 + 14
    assert stats.uncached_requests == 2


class CountingCache(PrefixCache):
    """Counts integrity checks (a subclass, not a patched instance: the cache may be a
    mypyc-compiled class, whose instances take no new attributes)."""

    checks = 0

    def check_integrity(self) -> None:
        self.checks += 1
        super().check_integrity()


def test_check_runs_integrity_after_every_request() -> None:
    built = cache_of("sglang-lru", 10**9)
    cache = CountingCache(built.spec, built.memory, built.eviction, built.admission)
    replay_sequential(two_sessions(), cache, None, check=True)
    assert cache.checks == 3
    replay_sequential(two_sessions(), cache, None, check=False)
    assert cache.checks == 3


@pytest.mark.parametrize("policy", ["jenga", "marconi", "sglang-lru", "vllm-blocks"])
def test_every_bundle_replays_with_its_tuner(policy: str) -> None:
    cache, tuner = build_cache(policy, SPEC, byte_budget(SPEC, 14 * KV + STATE))
    stats = replay_sequential(two_sessions(), cache, tuner, check=True)
    assert stats.requests == 3
    assert 0 <= stats.hit_tokens <= stats.input_tokens
    assert stats.tuning_s >= 0 and stats.wall_s >= 0
