"""Property tests of the host tier: random request streams over small device and host budgets
keep every invariant of both tiers (radix/host.py T1-T6 and the tree's own), and a drained
cache gives every byte back.

Requests draw tokens from a small alphabet, so prefixes collide, nodes split, states move down
and back, host memory fills and evicts, loads are taken or declined (three link speeds around
the tiny spec's break-even) and host nodes are adopted by requests that recompute them."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from radix_helpers import attention_spec, hybrid_spec

from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.admission import EveryBlockAdmission, SpeculativeAdmission
from jenga_sglang.policies.branching import BranchLearningAdmission
from jenga_sglang.policies.bundles import byte_budget
from jenga_sglang.policies.eviction import FlopAwareEviction, JengaEviction, LruEviction
from jenga_sglang.policies.host import FlopAwareTier
from jenga_sglang.pool import JengaPool, geometry_for_spec
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.memory import CacheMemory
from jenga_sglang.radix.tokens import TokenSeq

RATE = 1e3  # FLOP/s: a tiny-spec token recomputes in ~0.04 s
LINKS = (1e12, 500.0, 1e-3)  # bytes/s: loads always, sometimes, never beat recompute


def byte_memory(spec: ModelSpec) -> CacheMemory:
    return byte_budget(spec, 24 * spec.kv_bytes_per_token + 2 * max(spec.state_bytes, 1))


def pool_memory(spec: ModelSpec) -> CacheMemory:
    geometry = geometry_for_spec(spec, alignment=16)
    return JengaPool(geometry, 6 * geometry.large_page_bytes)


CONFIGS = {
    "hybrid-bytes-lru": (hybrid_spec, byte_memory, LruEviction, SpeculativeAdmission),
    "hybrid-bytes-flop": (
        hybrid_spec,
        byte_memory,
        lambda: FlopAwareEviction(alpha=0.5),
        SpeculativeAdmission,
    ),
    "hybrid-pool-jenga": (
        hybrid_spec,
        pool_memory,
        lambda: JengaEviction(alpha=0.5),
        lambda: SpeculativeAdmission(min_branch_tokens=3),
    ),
    "hybrid-bytes-rewrite": (
        hybrid_spec,
        byte_memory,
        JengaEviction,
        lambda: BranchLearningAdmission(min_samples=1, min_rate=0.0, window=8, ghost_tokens=40),
    ),
    "hybrid-bytes-runs": (hybrid_spec, byte_memory, LruEviction, lambda: EveryBlockAdmission(3)),
    "swa-bytes-lru": (
        lambda: attention_spec(window=3),
        byte_memory,
        LruEviction,
        SpeculativeAdmission,
    ),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), link=st.sampled_from(LINKS), host_kv=st.integers(4, 40))
def test_both_tiers_keep_their_invariants(
    config: str, seed: int, link: float, host_kv: int
) -> None:
    make_spec, make_memory, make_eviction, make_admission = CONFIGS[config]
    spec = make_spec()
    eviction = make_eviction()
    cache = PrefixCache(spec, make_memory(spec), eviction, make_admission())
    host_bytes = host_kv * spec.kv_bytes_per_token + max(spec.state_bytes, 1)
    cache.attach_host(byte_budget(spec, host_bytes), FlopAwareTier(eviction, link, RATE, 2))
    rng = random.Random(seed)

    def tokens() -> TokenSeq:
        return TokenSeq.of([rng.randrange(4) for _ in range(rng.randrange(1, 15))])

    for _ in range(150):
        if rng.random() < 0.1:
            cache.tree.evict_for(cache.kv_types[0])
        else:
            cache.serve(tokens(), tokens(), owner=0)
        cache.check_integrity()
    while cache.tree.evict_for(cache.kv_types[0]):  # the device drains into host or away
        cache.check_integrity()
    assert not any(True for _ in cache.tree.nodes()), "an unlocked device tree drains"
    host = cache.host
    assert host is not None
    while host.evict_for(cache.kv_types[0]):
        cache.check_integrity()
    assert not host.host_nodes() and host.memory.held_bytes() == 0, "and so does the host"
