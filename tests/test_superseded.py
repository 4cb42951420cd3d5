"""The superseded tier measures itself: a tree of thoughts turns it off, chat turns it back on."""

from __future__ import annotations

import pickle

import pytest
from radix_helpers import hybrid_spec, make_cache, node_at, seq, toks

from jenga_sglang.policies.bundles import byte_budget
from jenga_sglang.policies.eviction import JengaEviction
from jenga_sglang.policies.host import FlopAwareTier
from jenga_sglang.policies.superseded import SupersedeLearner
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.evict import drop_state
from jenga_sglang.radix.tokens import TokenSeq


def policy_of(cache: PrefixCache) -> JengaEviction:
    assert isinstance(cache.eviction, JengaEviction)
    return cache.eviction


def thought_and_first_child(cache: PrefixCache, base: int, owner: int) -> list[int]:
    """A thought (10 tokens + 1 output, state at 11) and its first child, which resumes from
    the thought's state and goes on below it: the thought's state is superseded."""
    thought = list(range(base, base + 10))
    cache.serve(TokenSeq.of(thought), toks(base + 100), owner=owner)
    path = [*thought, base + 100]
    cache.serve(TokenSeq.of([*path, base + 200, base + 201]), toks(base + 202), owner=owner + 1)
    return path


def learning_cache(**learner: int | float) -> PrefixCache:
    cache = make_cache(hybrid_spec(), eviction=JengaEviction(alpha=0.0))
    policy_of(cache).supersede = SupersedeLearner(**learner)  # type: ignore[arg-type]
    return cache


def test_a_sibling_leaving_where_a_dropped_state_was_revives_it_and_turns_the_tier_off():
    cache = learning_cache(ghosts=4, min_resolved=1)
    policy = policy_of(cache)
    path = thought_and_first_child(cache, 0, owner=1)
    thought = node_at(cache, *path)
    assert policy.is_superseded(thought) and policy.victim() is thought  # the tier, trusted
    cache.tree.evict_for(cache.tree.kv_types[0])  # drops the thought's state: a ghost at 11
    assert thought.parent is None and policy.supersede.revived == 0
    # the second child leaves the merged edge exactly where the dropped state was
    cache.serve(TokenSeq.of([*path, 300, 301]), toks(302), owner=3)
    assert (policy.supersede.revived, policy.supersede.dead) == (1, 0)
    assert not policy.supersede.trusted
    # a new thought's superseded state now competes like any node: the oldest leaf goes first
    later = thought_and_first_child(cache, 1000, owner=10)
    assert policy.is_superseded(node_at(cache, *later))
    assert policy.victim() is not node_at(cache, *later)
    assert not policy.victim().children  # type: ignore[union-attr]
    cache.check_integrity()


def chat_session(cache: PrefixCache, base: int, owner: int) -> list[int]:
    """Two turns: turn 1 resumes from turn 0's end and goes on; returns turn 0's path."""
    cache.serve(seq(base, 6), toks(base + 50), owner=owner)
    cache.serve(seq(base, 6).concat(toks(base + 50, base + 60)), toks(base + 61), owner=owner + 1)
    return [*range(base, base + 6), base + 50]


def test_ghosts_that_nobody_comes_back_to_are_dead_and_turn_the_tier_back_on():
    cache = learning_cache(ghosts=2, min_resolved=1)
    policy = policy_of(cache)
    path = thought_and_first_child(cache, 0, owner=1)
    cache.tree.evict_for(cache.tree.kv_types[0])
    cache.serve(TokenSeq.of([*path, 300, 301]), toks(302), owner=3)  # a revival: tier off
    assert not policy.supersede.trusted
    waiting = node_at(cache, *chat_session(cache, 5000, owner=50))
    assert policy.is_superseded(waiting) and policy.victim() is not waiting
    for s in range(4):  # turn 0 of four more sessions is dropped; nobody resumes there again
        turn0 = chat_session(cache, 2000 + 100 * s, owner=20 + 2 * s)
        drop_state(cache.tree, node_at(cache, *turn0))
    # four ghosts, room for two: the two oldest were pushed out unused
    assert (policy.supersede.revived, policy.supersede.dead) == (1, 2)
    assert policy.supersede.trusted  # 1 revival in 3 resolved is under the bar of a half
    assert policy.victim() is waiting  # re-ranked into the tier when it switched back on
    cache.check_integrity()


def test_the_tuners_copy_of_the_cache_keeps_the_ghosts():
    cache = learning_cache(ghosts=4, min_resolved=1)
    path = thought_and_first_child(cache, 0, owner=1)
    cache.tree.evict_for(cache.tree.kv_types[0])
    copy = pickle.loads(pickle.dumps(cache))  # what a tuner's replay starts from
    copy.serve(TokenSeq.of([*path, 300, 301]), toks(302), owner=3)
    assert policy_of(copy).supersede.revived == 1 and not policy_of(copy).supersede.trusted
    assert policy_of(cache).supersede.revived == 0  # the served cache is untouched
    copy.check_integrity()


def test_a_trusted_tier_is_decision_for_decision_the_old_one():
    cache = learning_cache(min_resolved=10**9)
    policy = policy_of(cache)
    path = thought_and_first_child(cache, 0, owner=1)
    cache.tree.evict_for(cache.tree.kv_types[0])
    cache.serve(TokenSeq.of([*path, 300, 301]), toks(302), owner=3)
    assert policy.supersede.revived == 1 and policy.supersede.trusted  # too little evidence
    later = thought_and_first_child(cache, 1000, owner=10)
    assert policy.victim() is node_at(cache, *later)


def tiered_learning_cache(**learner: int | float) -> PrefixCache:
    """A learning cache over a roomy host tier whose link always beats recompute."""
    cache = learning_cache(**learner)
    policy = policy_of(cache)
    cache.attach_host(byte_budget(cache.spec, 10**6), FlopAwareTier(policy, 1e12, 1e3, 2))
    return cache


def test_a_host_tier_keeps_superseded_states_as_often_as_they_come_back():
    """Odds 0 (nothing resolved yet): dropped. Then one of two ghosts revived: odds 1/2, so the
    next superseded state goes to host. A request resuming from it loads it back, and the
    learner counts that revival once, through the ghost the demotion left."""
    cache = tiered_learning_cache(ghosts=1, min_resolved=1, max_revival=1.0)
    policy, tree = policy_of(cache), cache.tree
    first = thought_and_first_child(cache, 0, owner=1)
    assert policy.reuse_odds(node_at(cache, *first)) == 0.0
    tree.evict_for(tree.kv_types[0])  # dropped: a ghost at its end
    assert tree.host is not None and tree.host.demoted_states == 0
    second = thought_and_first_child(cache, 1000, owner=3)
    tree.evict_for(tree.kv_types[0])  # its ghost pushes the first one's out: a death
    cache.serve(TokenSeq.of([*second, 300, 301]), toks(302), owner=5)  # a sibling: a revival
    learner = policy.supersede
    assert (learner.revived, learner.dead, learner.trusted) == (1, 1, True)
    third = thought_and_first_child(cache, 2000, owner=6)
    thought = node_at(cache, *third)
    assert policy.is_superseded(thought) and policy.reuse_odds(thought) == 0.5
    assert policy.victim() is thought
    tree.evict_for(tree.kv_types[0])
    assert thought.state is None and thought.host_state is not None, "its state went to host"
    assert thought.parent is not None, "the node stays, unmerged, for the state's position"
    sibling = cache.serve(TokenSeq.of([*third, 400, 401]), toks(402), owner=8)
    assert sibling.hit_tokens == len(third) and sibling.host_hit_tokens == len(third)
    assert learner.host_revived == 1, "the load-back is one revival, seen at the ghost"
    assert learner.revived == 1, "the tier's trust counts what the device dropped"
    for base in (3000, 4000):  # two more go to host; nobody comes back to the first of them
        thought_and_first_child(cache, base, owner=base)
        tree.evict_for(tree.kv_types[0])
    assert tree.host.demoted_states == 3
    assert (learner.host_dead, learner.dead) == (1, 1), "a kept state's ghost pushed out unused"
    assert learner.revival_rate == 2 / 4  # both rings: one revival and one death each
    cache.check_integrity()


def test_a_split_leaves_the_hits_with_the_end_they_resumed_from():
    """The hits counted on a node resumed from its end; the part above a cut never was, and
    must not look superseded for them."""
    cache = learning_cache()
    path = thought_and_first_child(cache, 0, owner=1)
    thought = node_at(cache, *path)
    assert thought.hit_count == 1
    cache.serve(TokenSeq.of([*path[:5], 700, 701]), toks(702), owner=3)  # splits it after 5
    upper = thought.parent
    assert upper is not None and upper.end == 5 and upper.hit_count == 0
    assert thought.hit_count == 1
    cache.check_integrity()


@pytest.mark.parametrize(
    "kwargs", [{"ghosts": 0}, {"min_resolved": 0}, {"max_revival": 0.0}, {"max_revival": 1.5}]
)
def test_learner_rejects_bad_settings(kwargs):  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="need ghosts"):
        SupersedeLearner(**kwargs)
