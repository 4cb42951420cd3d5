"""A tree of pages (`PrefixCache(page=P)`, SGLang's --page-size P): whole pages only.

Hits, node boundaries, splits and checkpoints all fall on page boundaries, so no page is held by
two nodes (SGLang's paged allocator frees whole pages); what a page-1 tree would hit is floored
to a page.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from radix_helpers import attention_spec, hybrid_spec, seq, toks
from test_radix_properties import CONFIGS, World, random_ops

from jenga_sglang.policies.admission import SpeculativeAdmission
from jenga_sglang.policies.bundles import byte_budget
from jenga_sglang.policies.eviction import LruEviction
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.contracts import CheckpointPlan
from jenga_sglang.radix.tokens import TokenSeq

PAGE = 4


def _aligned(cache: PrefixCache) -> None:
    for node in cache.nodes():
        assert node.start % PAGE == 0 and node.end % PAGE == 0, node
        assert all(at % PAGE == 0 for at, _ in node.inner), node


@pytest.mark.parametrize(
    "config", ["hybrid-bytes-lru", "hybrid-pool-jenga", "hybrid-bytes-rewrite", "swa-pool-lru"]
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_every_boundary_stays_on_a_page(config: str, seed: int) -> None:
    make_spec, make_memory, make_eviction, make_admission = CONFIGS[config]
    spec = make_spec()
    cache = PrefixCache(spec, make_memory(spec), make_eviction(), make_admission(), page=PAGE)
    world = World(cache)
    rng = random.Random(seed)
    for action in random_ops(rng):
        world.step(action)
        cache.check_integrity()  # links keyed by first pages, whole-page edges
        _aligned(cache)
        probe = TokenSeq.of([rng.randrange(4) for _ in range(rng.randrange(1, 15))])
        assert cache.lookup(probe).length % PAGE == 0


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_hit_is_the_longest_common_prefix_floored_to_a_page(seed: int) -> None:
    """With room for everything (no eviction) the hit of a query is the longest prefix it
    shares with any stored sequence, floored to a page; stored = input + output floored."""
    rng = random.Random(seed)
    spec = attention_spec()
    cache = PrefixCache(
        spec, byte_budget(spec, 10**7), LruEviction(), SpeculativeAdmission(), page=PAGE
    )
    stored: list[list[int]] = []

    def ids() -> list[int]:
        return [rng.randrange(3) for _ in range(rng.randrange(1, 20))]

    for _ in range(40):
        inp, out = ids(), ids()
        cache.serve(TokenSeq.of(inp), TokenSeq.of(out), 0)
        whole = inp + out
        stored.append(whole[: len(whole) - len(whole) % PAGE])
        query = ids()
        best = max(_common(query, s) for s in stored)
        assert cache.lookup(TokenSeq.of(query)).length == best - best % PAGE


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_two_keys_that_part_inside_a_page_share_only_the_pages_before_it() -> None:
    spec = attention_spec()
    cache = PrefixCache(
        spec, byte_budget(spec, 10**6), LruEviction(), SpeculativeAdmission(), page=PAGE
    )
    tree = cache.tree
    a = seq(0, 8)
    b = toks(0, 1, 2, 3, 4, 5, 9, 9)  # leaves a at token 6, inside the second page
    kv_a = cache.allocate_kv(8, 1)
    tree.insert(a, 0, kv_a, {}, cache.tick())
    kv_b = cache.allocate_kv(4, 2)  # b's second page is its own: the first is shared
    tree.insert(b, 4, kv_b, {}, cache.tick())
    cache.check_integrity()
    (first,) = tree.root.children.values()
    assert (first.start, first.end, len(first.children)) == (0, 4, 2)
    assert sorted(len(c.key) for c in first.children.values()) == [4, 4]
    assert cache.lookup(toks(0, 1, 2, 3, 4, 5, 9, 9, 1)).length == 8
    assert cache.lookup(toks(0, 1, 2, 3, 4, 5, 7)).length == 4


def test_inserts_and_states_off_a_page_boundary_are_refused() -> None:
    spec = hybrid_spec()
    cache = PrefixCache(
        spec, byte_budget(spec, 10**6), LruEviction(), SpeculativeAdmission(), page=PAGE
    )
    kv = cache.allocate_kv(6, 1)
    with pytest.raises(ValueError, match="whole pages"):
        cache.tree.insert(seq(0, 6), 0, kv, {}, cache.tick())
    kv = cache.allocate_kv(8, 1)
    (state,) = cache.allocate_states(1, 1)
    with pytest.raises(ValueError, match="not on a 4-token page"):
        cache.tree.insert(seq(0, 8), 0, kv, {6: state}, cache.tick())
    with pytest.raises(ValueError, match="page size"):
        PrefixCache(spec, byte_budget(spec, 10**6), LruEviction(), SpeculativeAdmission(), page=0)


def test_a_plan_keeps_positions_on_pages_past_the_hit() -> None:
    plan = CheckpointPlan(prefill_at=(5, 9, 13), finish_at=(23,), cache_len=23, expendable_from=9)
    paged = plan.on_pages(4, hit=8)
    assert paged.prefill_at == (12,)  # 5 -> 4 and 9 -> 8 are no further than the hit
    assert paged.finish_at == (20,)
    assert paged.cache_len == 20
    assert paged.expendable_from == 12  # the page holding 9 is kept whole


def test_a_served_sequence_keeps_its_states_on_pages() -> None:
    spec = hybrid_spec()
    cache = PrefixCache(
        spec,
        byte_budget(spec, 10**6),
        LruEviction(),
        SpeculativeAdmission(prompt_end=True),
        page=PAGE,
    )
    cache.serve(seq(0, 10), seq(100, 5), 1)  # prompt end 10 -> 8, finish 15 -> 12
    ends = sorted(
        [n.end for n in cache.nodes() if n.state is not None]
        + [at for n in cache.nodes() for at, _ in n.inner]
    )  # LRU keeps a run
    assert ends == [8, 12]
    hit = cache.lookup(TokenSeq.of([*range(10), 7]))
    assert hit.length == 8 and hit.state is not None
