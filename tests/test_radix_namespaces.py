"""Namespaces in the tree (radix/spaces.py): the same tokens in two namespaces are two entries
that never share, under one memory and one eviction order; the ghost and the tuner's replays
keep them apart too."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from radix_helpers import hybrid_spec, make_cache, seq, toks

from jenga_sglang.policies.branching import BranchLearningAdmission
from jenga_sglang.policies.bundles import byte_budget
from jenga_sglang.policies.eviction import FlopAwareEviction, JengaEviction, LruEviction
from jenga_sglang.policies.ghost import GhostIndex
from jenga_sglang.policies.host import FlopAwareTier
from jenga_sglang.policies.replay_grid import replay_score, snapshot
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.contracts import EvictionPolicy
from jenga_sglang.radix.pages import IdPages
from jenga_sglang.radix.tokens import TokenSeq


def test_the_same_prompt_in_two_namespaces_shares_nothing() -> None:
    cache = make_cache(hybrid_spec())
    prompt, out = seq(0, 40), toks(900, 901)
    assert cache.serve(prompt, out, owner=1, namespace="a").hit_tokens == 0
    assert cache.serve(prompt, out, owner=2, namespace="b").hit_tokens == 0  # a's is not b's
    assert cache.serve(prompt, out, owner=3).hit_tokens == 0  # nor the default namespace's
    turn2 = prompt.concat(out).concat(seq(100, 10))
    for owner, namespace in enumerate(("a", "b", None), start=4):
        assert cache.serve(turn2, toks(902), owner, namespace).hit_tokens == 42  # its own state
    assert sorted(cache.tree.spaces) == ["a", "b"]
    assert cache.lookup(prompt, "c").length == 0  # a namespace never seen
    cache.check_integrity()


def test_positions_and_checkpoints_below_a_namespace_root_are_the_default_ones() -> None:
    """A namespace adds no token: its nodes start at 0 and its states lie where they would."""
    plain, spaced = make_cache(hybrid_spec()), make_cache(hybrid_spec())
    for cache, namespace in ((plain, None), (spaced, "salt")):
        cache.serve(seq(0, 30), toks(900), owner=1, namespace=namespace)
        cache.serve(seq(0, 20).concat(seq(500, 10)), toks(901), owner=2, namespace=namespace)
    shape = [[(n.start, n.end, n.state is not None) for n in c.nodes()] for c in (plain, spaced)]
    assert shape[0] == shape[1]
    assert spaced.tree.spaces["salt"].end == 0
    assert all(n.parent is not plain.root for n in spaced.nodes())


@pytest.mark.parametrize("make_eviction", [LruEviction, FlopAwareEviction, JengaEviction])
def test_eviction_weighs_every_namespace_under_one_budget(
    make_eviction: type[EvictionPolicy],
) -> None:
    """Room for two conversations: a third one, in the default namespace, evicts the least
    recent one whichever namespace it is in, and an emptied namespace loses its root."""
    spec = hybrid_spec()
    per_conversation = 41 * spec.kv_bytes_per_token + 2 * spec.state_bytes
    cache = make_cache(spec, budget=2 * per_conversation, eviction=make_eviction())
    cache.serve(seq(0, 40), toks(900), owner=1, namespace="a")
    cache.serve(seq(0, 40), toks(900), owner=2, namespace="b")
    cache.serve(seq(1000, 40), toks(900), owner=3)
    assert "a" not in cache.tree.spaces and "a" not in cache.tree.space_names.values()
    assert cache.lookup(seq(0, 40).concat(toks(900)), "b").length == 41  # b's is kept
    cache.check_integrity()
    while cache.tree.evict_for(cache.tree.kv_types[0]):
        cache.check_integrity()
    assert not cache.tree.spaces and next(cache.nodes(), None) is None


def test_a_locked_node_of_a_namespace_is_kept_and_its_root_stays() -> None:
    cache = make_cache(hybrid_spec(), budget=10**6)
    cache.serve(seq(0, 40), toks(900), owner=1, namespace="a")
    node = cache.lookup(seq(0, 40).concat(toks(900)), "a").node
    assert node is not None
    cache.pin(node)
    assert cache.tree.spaces["a"].lock_ref == 1  # the lock stops below the namespace's root
    assert not cache.tree.evict_for(cache.tree.kv_types[0])
    cache.unpin(node)
    cache.check_integrity()


def test_ghost_branch_points_stay_in_their_namespace() -> None:
    ghost = GhostIndex(capacity=1000)
    history = seq(0, 100)
    ghost.remember(history, "a")
    rewritten = seq(0, 40).concat(toks(999))
    assert ghost.branch(rewritten, "a").length == 40
    assert ghost.branch(rewritten, "b").length == 0
    assert ghost.branch(rewritten).length == 0
    ghost.remember(history)  # the default namespace now has it too: two entries
    assert len(ghost) == 200
    ghost.check_integrity()


def test_ghost_capacity_is_one_lru_over_every_namespace() -> None:
    ghost = GhostIndex(capacity=150)
    ghost.remember(seq(0, 100), "a")
    ghost.remember(seq(0, 100), "b")  # 200 > 150: a's, the least recent, is forgotten
    assert ghost.branch(seq(0, 100), "a").length == 0
    assert ghost.branch(seq(0, 100), "b").length == 100
    assert "a" not in ghost._spaces  # and its root with it
    ghost.check_integrity()


def test_the_admission_recalls_branch_points_of_the_request_namespace_only() -> None:
    """A rewriting workload: once the history is evicted, the ghost names the branch point
    to the namespace that served it, and to no other."""
    admission = BranchLearningAdmission(min_samples=1, min_rate=0.0)
    cache = make_cache(hybrid_spec(), admission=admission)
    history = seq(0, 80)
    cache.serve(history, toks(900), owner=1, namespace="a")
    cache.serve(seq(0, 40).concat(seq(300, 20)), toks(901), owner=2, namespace="a")
    while cache.tree.evict_for(cache.tree.kv_types[0]):
        pass
    c = seq(0, 40).concat(seq(300, 10)).concat(seq(700, 10))  # leaves the second at 50
    for namespace, planned in (("a", (50,)), ("b", ())):
        found = cache.lookup(c, namespace)
        plan = cache.plan(c, found, len(c) + 1, namespace=namespace)
        assert plan.prefill_at == planned, namespace


def test_the_tuner_replays_each_request_in_its_namespace() -> None:
    cache = make_cache(hybrid_spec())
    snap = snapshot(cache)
    prompt, out = seq(0, 40), toks(900)
    turn2 = prompt.concat(out).concat(seq(100, 5))
    same = [(prompt, out, "a"), (turn2, out, "a")]
    apart = [(prompt, out, "a"), (turn2, out, "b")]
    assert replay_score(snap, same, 0.0)[1] == 41
    assert replay_score(snap, apart, 0.0)[1] == 0


def _ops(rng: random.Random, count: int = 150) -> list[tuple[str, str | None, TokenSeq]]:
    def tokens() -> TokenSeq:
        return TokenSeq.of([rng.randrange(3) for _ in range(rng.randrange(1, 12))])

    spaces = [None, "a", "b"]
    ops: list[tuple[str, str | None, TokenSeq]] = []
    for _ in range(count):
        kind = rng.choice(["serve", "serve", "serve", "lookup", "evict"])
        ops.append((kind, rng.choice(spaces), tokens()))
    return ops


def _with_host(cache: PrefixCache, host_bytes: int) -> PrefixCache:
    """`cache` over a host tier of `host_bytes` (radix/host.py) whose link is fast enough
    that demoting and loading back always pay."""
    tier = FlopAwareTier(cache.eviction, 1e12, 1e3, layers=2)
    cache.attach_host(byte_budget(cache.spec, host_bytes), tier)
    return cache


def test_a_namespace_demoted_to_host_memory_keeps_its_root_and_its_own_hits() -> None:
    """Room on the device for one conversation, on the host for several: b's evicts a's to
    host memory, where it stays a's (its root stays, with host children only)."""
    spec = hybrid_spec()
    one = 12 * spec.kv_bytes_per_token + spec.state_bytes
    cache = _with_host(make_cache(spec, budget=one + 20), 4 * one)
    a_in, out = seq(0, 10), seq(100, 2)
    cache.serve(a_in, out, owner=1, namespace="a")
    cache.serve(a_in, out, owner=2, namespace="b")
    root = cache.tree.spaces["a"]
    assert not root.children and len(root.host_children) == 1  # a's went to host memory
    cache.check_integrity()
    turn2 = a_in.concat(out).concat(seq(400, 3))
    assert cache.serve(turn2, toks(9), owner=3, namespace="c").hit_tokens == 0
    again = cache.serve(turn2, toks(9), owner=4, namespace="a")
    assert again.hit_tokens == 12 and again.host_hit_tokens == 12  # a's own host copy
    cache.check_integrity()


@pytest.mark.parametrize("host", [0, 2], ids=["device", "host-tier"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_random_namespaced_streams_never_hit_another_namespace(host: int, seed: int) -> None:
    """Random serves, look-ups and evictions over three namespaces in a small memory (and a
    host tier of twice its size): the invariants hold after each, and no hit is longer than
    the longest prefix the request shares with a sequence served in its own namespace."""
    spec = hybrid_spec()
    budget = 30 * spec.kv_bytes_per_token + 3 * spec.state_bytes
    cache = make_cache(spec, budget=budget, eviction=JengaEviction())
    if host:  # demotions, host hits, host evictions, roots with host children only
        _with_host(cache, host * budget)
    served: dict[str | None, list[TokenSeq]] = {None: [], "a": [], "b": []}
    for owner, (kind, namespace, tokens) in enumerate(_ops(random.Random(seed))):
        if kind == "evict":
            cache.tree.evict_for(cache.tree.kv_types[0])
        else:
            hit = cache.lookup(tokens, namespace).length
            bound = max((t.common_prefix(tokens) for t in served[namespace]), default=0)
            assert hit <= bound, (namespace, hit, bound)
            if kind == "serve":
                cache.serve(tokens, toks(7), owner, namespace)
                served[namespace].append(tokens.concat(toks(7)))
        cache.check_integrity()
    while cache.tree.evict_for(cache.tree.kv_types[0]):
        cache.check_integrity()
    while cache.host is not None and cache.host.evict_for(cache.tree.kv_types[0]):
        cache.check_integrity()
    assert not cache.tree.spaces  # every namespace's root went with its last node


def test_integrity_catches_an_empty_namespace_root() -> None:
    cache = make_cache(hybrid_spec())
    cache.serve(seq(0, 10), toks(900), owner=1, namespace="a")
    root = cache.tree.spaces["a"]
    (child,) = root.children.values()
    cache.tree.spaces["ghost"] = type(root)(
        99, TokenSeq(b""), None, [IdPages([])], [0], now=0
    )  # never registered by name, no nodes
    cache.tree.spaces["ghost"].lock_ref = 1
    with pytest.raises(AssertionError, match="namespace"):
        cache.check_integrity()
    assert child.parent is root


def test_an_unknown_namespace_costs_the_default_nothing() -> None:
    """A default-namespace cache never makes a namespace root."""
    cache: PrefixCache = make_cache(hybrid_spec())
    cache.serve(seq(0, 30), toks(900), owner=1)
    cache.serve(seq(0, 30), toks(900), owner=2)
    assert cache.tree.spaces == {} and cache.tree.space_names == {}
