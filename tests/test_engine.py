"""Engine replay on tiny scenarios whose timings follow from the documented cost model.

The cost model here has effectively unlimited bandwidth, so a step takes
overhead + FLOPs / peak, and every expected TTFT is a sum of such steps written out by hand.
Model marconi-7b, policy sglang-lru.
"""

from __future__ import annotations

import pytest

from jenga_sglang.bench.runs.runner import build_memory
from jenga_sglang.bench.simulation.cost_model import CostModel
from jenga_sglang.bench.simulation.engine import EngineConfig, replay_engine
from jenga_sglang.bench.traces.packed import PackedRequest, pack
from jenga_sglang.bench.traces.trace import Request
from jenga_sglang.models.presets import get_spec
from jenga_sglang.policies.bundles import build_cache, byte_budget
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.memory import ByteBudget

SPEC = get_spec("marconi-7b")
KV = SPEC.kv_bytes_per_token
STATE = SPEC.state_bytes
OVERHEAD = 0.001
PEAK = 1e15
COST = CostModel(
    peak_flops=PEAK,
    mfu=1.0,
    hbm_bytes_per_s=1e30,
    bandwidth_efficiency=1.0,
    step_overhead_s=OVERHEAD,
)


def step(flops: float) -> float:
    return OVERHEAD + flops / PEAK


def prefill(a: int, b: int) -> float:
    return step(SPEC.prefill_flops(a, b))


def decode(pos: int) -> float:
    """A decode step feeding back the token at position `pos`."""
    return step(SPEC.prefill_flops(pos, pos + 1))


def _seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def cache_of(capacity: int, policy: str = "sglang-lru") -> PrefixCache:
    cache, _ = build_cache(policy, SPEC, byte_budget(SPEC, capacity))
    return cache


def shared_prefix(second_ts: float) -> list[PackedRequest]:
    """r1: 10 in, 4 out. r2: r1's 14 tokens + 6 new, 4 out."""
    r1_in, r1_out = _seq(1, 10), _seq(11, 4)
    return pack(
        [
            Request(0, 0, 0.0, r1_in, r1_out),
            Request(0, 1, second_ts, r1_in + r1_out + _seq(15, 6), _seq(21, 4)),
        ]
    )


def two_strangers(out: int) -> list[PackedRequest]:
    return pack(
        [
            Request(0, 0, 0.0, _seq(1, 10), _seq(11, out)),
            Request(1, 0, 0.0, _seq(101, 10), _seq(111, out)),
        ]
    )


def test_cost_model_is_a_roofline() -> None:
    cost = CostModel(
        peak_flops=100.0,
        mfu=0.5,
        hbm_bytes_per_s=10.0,
        bandwidth_efficiency=0.5,
        step_overhead_s=1.0,
    )
    assert cost.step_seconds(flops=500.0, bytes_read=10.0) == pytest.approx(1.0 + 10.0)
    assert cost.step_seconds(flops=10.0, bytes_read=50.0) == pytest.approx(1.0 + 10.0)
    with pytest.raises(ValueError, match="unknown cost model field 'nope'"):
        CostModel.with_overrides({"nope": "1"})
    assert CostModel.with_overrides({"mfu": "0.25"}).mfu == 0.25
    with pytest.raises(ValueError, match="mfu"):
        CostModel(mfu=0.0)


def test_second_request_after_the_first_finished_gets_a_hit() -> None:
    stats = replay_engine(shared_prefix(second_ts=100.0), cache_of(10**9), None, COST, check=True)
    assert (stats.requests, stats.hit_tokens, stats.input_tokens) == (2, 14, 30)
    assert stats.ttfts == pytest.approx([prefill(0, 10), prefill(14, 20)])
    last = 100.0 + prefill(14, 20) + decode(20) + decode(21) + decode(22)
    assert stats.makespan_s == pytest.approx(last)
    assert stats.retractions == 0


def test_tiny_budget_queues_the_second_request() -> None:
    """Reserve per request: 10 prefill + 4 decode tokens + 1 state; room for one only.

    r1 runs alone: prefill (first token) then 3 decode steps; it finishes, and r2 is admitted
    in step 5, so r2's TTFT is the whole of r1 plus its own prefill.
    """
    cache = cache_of(19 * KV + STATE)
    config = EngineConfig(decode_reserve_tokens=4)
    stats = replay_engine(two_strangers(out=4), cache, None, COST, config, check=True)
    r1 = prefill(0, 10) + decode(10) + decode(11) + decode(12)
    assert stats.ttfts == pytest.approx([prefill(0, 10), r1 + prefill(0, 10)])
    assert [row[1] for row in stats.timeline[:5]] == [0, 1, 1, 1, 0]  # decode batch per step
    assert stats.retractions == 0 and stats.requests == 2


def test_decode_growth_retracts_the_newest_request() -> None:
    """No decode reserve: both are admitted (2 x (10 tokens + state) fits in 25 tokens + 2
    states). After step 1 they hold 22 tokens, after step 2 24; in step 3 r1 takes the 25th
    and r2 runs out: it is retracted, restarts after r1 and both complete."""
    cache = cache_of(25 * KV + 2 * STATE)
    config = EngineConfig(decode_reserve_tokens=0)
    stats = replay_engine(two_strangers(out=10), cache, None, COST, config, check=True)
    assert stats.retractions == 1
    assert stats.requests == 2 and stats.rejected == 0
    both = step(2 * SPEC.prefill_flops(0, 10))  # one step prefills both
    assert stats.ttfts == pytest.approx([both, both])  # the first TTFT stands
    assert isinstance(cache.memory, ByteBudget)
    assert cache.memory.capacity_violations == 0
    assert max(row[3] + row[4] for row in stats.timeline) <= cache.memory.capacity_bytes


def test_a_request_that_cannot_fit_is_rejected_not_looped() -> None:
    stats = replay_engine(two_strangers(out=4), cache_of(5 * KV + STATE), None, COST, check=True)
    assert stats.rejected == 2 and stats.requests == 0


def test_memory_timeline_partitions_capacity() -> None:
    cache = cache_of(19 * KV + STATE)
    stats = replay_engine(two_strangers(out=4), cache, None, COST, check=True)
    for _, _, _, used, evictable, wasted, free in stats.timeline:
        assert min(used, evictable, wasted, free) >= 0
        assert used + evictable + wasted + free == cache.memory.capacity_bytes
    assert stats.timeline[-1][4] > 0  # the finished request stays cached (evictable)


@pytest.mark.parametrize("policy", ["jenga", "marconi", "vllm-blocks"])
def test_other_bundles_and_the_jenga_pool(policy: str) -> None:
    memory = build_memory("jenga", SPEC, 10**9)
    cache, tuner = build_cache(policy, SPEC, memory)
    stats = replay_engine(shared_prefix(second_ts=100.0), cache, tuner, COST, check=True)
    assert stats.requests == 2
    assert stats.hit_tokens == (0 if policy == "vllm-blocks" else 14)  # blocks of 32 > 14
