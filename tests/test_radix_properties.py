"""Property tests: random interleavings of cache operations keep every invariant.

Each example runs 200 operations (match, serve, insert, lock, unlock, allocate, free, evict) on a
small token alphabet, so prefixes collide, nodes split and merge, and memory runs out often.
`check_integrity()` runs after every operation: per page type free + evictable + used == total,
no page owned twice, every cached page reachable from exactly one node, locks consistent.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from radix_helpers import attention_spec, hybrid_spec

from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.admission import EveryBlockAdmission, SpeculativeAdmission
from jenga_sglang.policies.branching import BranchLearningAdmission
from jenga_sglang.policies.bundles import byte_budget
from jenga_sglang.policies.eviction import FlopAwareEviction, JengaEviction, LruEviction
from jenga_sglang.pool import JengaPool, geometry_for_spec
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.memory import CacheMemory
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import OutOfMemory, Pages, PageType
from jenga_sglang.radix.tokens import TokenSeq


def random_ops(rng: random.Random, count: int = 200) -> list[tuple]:  # type: ignore[type-arg]
    """`count` operations over a 4-token alphabet (drawn from a seed so that examples are cheap;
    hypothesis still picks, records and replays the seeds)."""

    def tokens() -> list[int]:
        return [rng.randrange(4) for _ in range(rng.randrange(1, 15))]

    makers = [
        lambda: ("serve", tokens(), tokens()),
        lambda: ("serve", tokens(), tokens()),
        lambda: ("match", tokens()),
        lambda: ("lock", tokens()),
        lambda: ("unlock", rng.randrange(8)),
        lambda: ("alloc", rng.randrange(1, 13)),
        lambda: ("free", rng.randrange(8)),
        lambda: ("evict",),
        lambda: ("alpha", rng.choice([0.0, 0.5, 2.0])),
    ]
    return [rng.choice(makers)() for _ in range(count)]


@dataclass
class World:
    cache: PrefixCache
    locked: list[Node] = field(default_factory=list)
    running: list[list[tuple[PageType, Pages]]] = field(default_factory=list)
    owner: int = 0

    def step(self, action: tuple) -> None:  # type: ignore[type-arg]
        kind = action[0]
        tree = self.cache.tree
        self.owner += 1
        if kind == "serve":
            self.cache.serve(TokenSeq.of(action[1]), TokenSeq.of(action[2]), self.owner)
        elif kind == "match":
            key = TokenSeq.of(action[1])
            self.cache.admit(key, self.cache.lookup(key))
        elif kind == "lock":
            node = tree.match(TokenSeq.of(action[1])).node
            if node is not None:
                tree.lock(node)
                self.locked.append(node)
        elif kind == "unlock" and self.locked:
            tree.unlock(self.locked.pop(action[1] % len(self.locked)))
        elif kind == "alloc":
            try:
                kv = self.cache.allocate_kv(action[1], self.owner)
            except OutOfMemory:
                return
            self.running.append(list(zip(tree.kv_types, kv, strict=True)))
        elif kind == "free" and self.running:
            for ptype, pages in self.running.pop(action[1] % len(self.running)):
                self.cache.memory.free(ptype, pages)
        elif kind == "evict":
            tree.evict_for(tree.kv_types[0])
        elif kind == "alpha":
            self.cache.eviction.alpha = action[1]


def byte_memory(spec: ModelSpec) -> CacheMemory:
    return byte_budget(spec, 24 * spec.kv_bytes_per_token + 2 * max(spec.state_bytes, 1))


def pool_memory(spec: ModelSpec) -> CacheMemory:
    geometry = geometry_for_spec(spec, alignment=16)
    return JengaPool(geometry, 6 * geometry.large_page_bytes)


CONFIGS = {
    "hybrid-bytes-lru": (hybrid_spec, byte_memory, LruEviction, SpeculativeAdmission),
    "hybrid-bytes-flop": (hybrid_spec, byte_memory, FlopAwareEviction, SpeculativeAdmission),
    "hybrid-pool-jenga": (
        hybrid_spec,
        pool_memory,
        JengaEviction,
        lambda: SpeculativeAdmission(min_branch_tokens=3),
    ),
    "hybrid-pool-flop": (hybrid_spec, pool_memory, FlopAwareEviction, SpeculativeAdmission),
    # rewrites count from the first mid-edge divergence: ghost recall and expendable tails on
    # almost every serve, and a ghost small enough to forget all the time
    "hybrid-bytes-rewrite": (
        hybrid_spec,
        byte_memory,
        JengaEviction,
        lambda: BranchLearningAdmission(min_samples=1, min_rate=0.0, window=8, ghost_tokens=40),
    ),
    "hybrid-pool-blocks": (hybrid_spec, pool_memory, LruEviction, lambda: EveryBlockAdmission(3)),
    "swa-pool-lru": (
        lambda: attention_spec(window=3),
        pool_memory,
        LruEviction,
        SpeculativeAdmission,
    ),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_invariants_hold_after_every_operation(config: str, seed: int) -> None:
    make_spec, make_memory, make_eviction, make_admission = CONFIGS[config]
    spec = make_spec()
    world = World(PrefixCache(spec, make_memory(spec), make_eviction(), make_admission()))
    ghost = getattr(world.cache.admission, "ghost", None)
    for action in random_ops(random.Random(seed)):
        world.step(action)
        world.cache.check_integrity()
        if ghost is not None:
            ghost.check_integrity()
    while world.locked:
        world.cache.tree.unlock(world.locked.pop())
    while world.cache.tree.evict_for(world.cache.tree.kv_types[0]):
        world.cache.check_integrity()
    assert sum(1 for _ in world.cache.tree.nodes()) == 0, "unlocked tree must drain completely"


def chain_view(cache: PrefixCache) -> list[tuple]:  # type: ignore[type-arg]
    """The tree as the chains its runs stand for: one row per node or run segment (tokens,
    start, end, checkpointed, lock_ref, last_access, hit_count), ids left out."""
    rows = []
    for node in cache.tree.nodes():
        bounds = [node.start, *(at for at, _ in node.inner), node.end]
        for lo, hi in pairwise(bounds):
            tokens = tuple(node.key.slice(lo - node.start, hi - node.start).tolist())
            checkpointed = hi < node.end or node.state is not None
            rows.append(
                (tokens, lo, hi, checkpointed, node.lock_ref, node.last_access, node.hit_count)
            )
    return sorted(rows)


def observed(world: World) -> tuple:  # type: ignore[type-arg]
    memory = world.cache.memory
    tree = world.cache.tree
    usage = [memory.usage(t) for t in memory.page_types]
    return chain_view(world.cache), usage, tree.evicted_nodes, tree.evicted_states


@pytest.mark.parametrize("make_memory", [byte_memory, pool_memory])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_runs_decide_like_the_chains_they_stand_for(make_memory, seed: int) -> None:  # type: ignore[no-untyped-def]
    """LRU with runs (a state every 3 tokens: long ones) and LRU keeping every checkpoint on a
    node of its own make the same hits, evictions and memory moves after every operation."""
    worlds = []
    for runs in (True, False):
        spec = hybrid_spec()
        lru = LruEviction()
        lru.evicts_runs = runs
        worlds.append(World(PrefixCache(spec, make_memory(spec), lru, EveryBlockAdmission(3))))
    assert worlds[0].cache.tree.keeps_runs and not worlds[1].cache.tree.keeps_runs
    for action in random_ops(random.Random(seed)):
        for world in worlds:
            world.step(action)
        assert observed(worlds[0]) == observed(worlds[1]), action
