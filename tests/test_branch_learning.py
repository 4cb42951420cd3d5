"""Learned branch positions (admission) and abandoned tails (eviction) on small hand-built trees."""

from __future__ import annotations

import pytest
from radix_helpers import hybrid_spec, make_cache, seq, toks

from jenga_sglang.policies.base import Branch
from jenga_sglang.policies.branching import BranchLearningAdmission
from jenga_sglang.policies.bypass import BypassLearner
from jenga_sglang.policies.eviction import JengaEviction
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.node import Node


def node_ending(cache: PrefixCache, end: int, first: int) -> Node:
    (node,) = [n for n in cache.tree.nodes() if n.end == end and n.key[0] == first]
    return node


# ---------------------------------------------------------------- Branch.tail


def test_tail_counts_the_cached_sequence_left_behind_down_to_its_leaf():
    cache = make_cache(hybrid_spec())
    cache.serve(seq(0, 20), toks(900), owner=1)  # one 21-token sequence
    walk = cache.tree.walk(seq(0, 12).concat(toks(500)))
    assert walk.branch().tail == 21 - 12  # left it 9 tokens before its end
    # a checkpoint inside the sequence splits it into a chain: the tail still runs to the leaf
    cache.tree.insert(seq(0, 16), 16, [cache.allocate_kv(0, 2)[0]], {16: _state(cache)}, 3)
    assert cache.tree.walk(seq(0, 12).concat(toks(500))).branch().tail == 9
    # continuing exactly at the end, or leaving at a node end: no tail
    assert cache.tree.walk(seq(0, 20).concat(toks(900, 1))).branch().tail == 0
    assert cache.tree.walk(seq(0, 16).concat(toks(7))).branch().tail == 0


def test_tail_is_zero_when_the_edge_forks_below():
    cache = make_cache(hybrid_spec())
    cache.serve(seq(0, 20), toks(900), owner=1)
    cache.serve(seq(0, 16).concat(toks(600)), toks(901), owner=2)  # forks at 16
    assert cache.tree.walk(seq(0, 12).concat(toks(500))).branch().tail == 0


def _state(cache: PrefixCache):  # type: ignore[no-untyped-def]
    (pages,) = cache.allocate_states(1, owner=3)
    return pages


# ---------------------------------------------------------------- admission


def learner(**kw: object) -> BranchLearningAdmission:
    args: dict[str, object] = {"min_gap": 10, "min_samples": 4, "window": 8}
    args.update(kw)
    return BranchLearningAdmission(**args)  # type: ignore[arg-type]


def test_checkpoints_a_fresh_long_prefill_at_learned_branch_distances():
    admission = learner(quantiles=(0.25, 0.75), gate=0.75)
    for tail in (100, 200, 300, 400):  # four requests left their predecessor this far back
        admission.plan(Branch(1000, False, False, tail=tail), 2000, 2100, 900)
    assert admission.predicted_tails() == [100, 200, 300, 400]
    # a request that found none of its history (left the tree at a shared junction, hit 50)
    plan = admission.plan(Branch(50, True, True, fanout=7), 3000, 3100, 50)
    # the next request is expected 200 or 400 tokens before this sequence's end (3100)
    assert plan.prefill_at == (2700, 2900)
    assert plan.finish_at == (3100,)


def test_no_prediction_while_requests_continue_at_the_end():
    # chat: most requests that find their history continue at its end (a leaf end, fanout 0)
    admission = learner(min_rate=0.5)
    for i in range(8):
        tail = 300 if i % 4 == 0 else 0
        branch = Branch(500, tail == 0, tail == 0, fanout=0, tail=tail)
        admission.plan(branch, 1000, 1100, 500)
    assert admission.predicted_tails() is None
    plan = admission.plan(Branch(50, True, True, fanout=7), 3000, 3100, 50)
    assert plan.prefill_at == ()


def test_no_extra_states_where_the_branch_checkpoint_already_serves():
    admission = learner(quantiles=(0.25, 0.75), gate=0.0)
    for tail in (100, 200, 300, 400):
        admission.plan(Branch(1000, False, False, tail=tail), 2000, 2100, 900)
    # it left its own history mid-edge: the speculative branch checkpoint is all it gets
    plan = admission.plan(Branch(1500, False, False, tail=250), 3000, 3100, 1000)
    assert plan.prefill_at == (1500,)
    # a short fresh prefill (not longer than the gate quantile) gets nothing either
    gated = learner(quantiles=(0.25,), gate=1.0)
    for tail in (100, 200, 300, 400):
        gated.plan(Branch(1000, False, False, tail=tail), 2000, 2100, 900)
    assert gated.plan(Branch(50, True, True, fanout=7), 400, 500, 50).prefill_at == ()


def test_predicted_checkpoints_keep_their_distance():
    admission = learner(quantiles=(0.25, 0.5, 0.75), gate=0.0, min_gap=150)
    for tail in (100, 150, 200, 600):
        admission.plan(Branch(1000, False, False, tail=tail), 2000, 2100, 900)
    plan = admission.plan(Branch(50, True, True, fanout=7), 3000, 3100, 50)
    # candidates 3100 - {600, 200, 150} = 2500, 2900, 2950, shallowest first: 2950 lies
    # within 150 tokens of 2900 and is dropped
    assert plan.prefill_at == (2500, 2900)


def test_prompt_end_state_does_not_crowd_out_predictions():
    """In the server (prompt_end, total = input + 1) predictions are measured from the input's
    end and keep their distance from the prompt-end state."""
    admission = learner(quantiles=(0.25, 0.75), gate=0.75, prompt_end=True, min_gap=150)
    for tail in (100, 200, 300, 400):
        admission.plan(Branch(1000, False, False, tail=tail), 2000, 2001, 900)
    plan = admission.plan(Branch(50, True, True, fanout=7), 3000, 3001, 50)
    # 3001 - 400 = 2601 and 3001 - 200 = 2801, then the prompt end
    assert plan.prefill_at == (2601, 2801, 3000)
    close = learner(quantiles=(0.25,), gate=0.0, prompt_end=True, min_gap=150)
    for tail in (100, 100, 100, 100):
        close.plan(Branch(1000, False, False, tail=tail), 2000, 2001, 900)
    # 3001 - 100 = 2901 lies within 150 tokens of the prompt end: only the prompt end
    assert close.plan(Branch(50, True, True, fanout=7), 3000, 3001, 50).prefill_at == (3000,)


def test_branch_learning_admission_rejects_bad_parameters():
    with pytest.raises(ValueError):
        BranchLearningAdmission(min_rate=1.5)
    with pytest.raises(ValueError):
        BranchLearningAdmission(quantiles=(1.2,))


# ---------------------------------------------------------------- eviction


def trusting() -> JengaEviction:
    policy = JengaEviction(alpha=0.0)
    policy.bypass = BypassLearner(control_every=10**9, min_resolved=1, max_revival=0.5)
    policy.bypass.dead = 1  # as if a control tail had already died unrevived
    return policy


def test_an_abandoned_tail_goes_before_older_entries_once_trusted():
    cache = make_cache(hybrid_spec(), eviction=trusting())
    cache.serve(seq(100, 10), toks(990), owner=0)  # an older, unrelated sequence
    cache.serve(seq(0, 20), toks(900), owner=1)  # request k
    cache.serve(seq(0, 12).concat(toks(500, 501)), toks(901), owner=2)  # k + 1 leaves it at 12
    tail = node_ending(cache, 21, 12)  # what request k left behind: tokens 12..19 + output
    older = node_ending(cache, 11, 100)
    assert older.last_access < tail.last_access
    assert cache.eviction.victim() is tail  # dead on arrival: first, though more recent
    cache.tree.evict_for(cache.tree.kv_types[0])
    assert cache.eviction.victim() is older  # then the usual order
    cache.check_integrity()


def test_an_abandoned_tail_is_an_ordinary_entry_until_the_control_sample_says_so():
    policy = JengaEviction(alpha=0.0)  # default learner: nothing resolved yet
    cache = make_cache(hybrid_spec(), eviction=policy)
    cache.serve(seq(100, 10), toks(990), owner=0)
    cache.serve(seq(0, 20), toks(900), owner=1)
    cache.serve(seq(0, 12).concat(toks(500, 501)), toks(901), owner=2)
    assert not policy.bypass.trusted
    assert policy.victim() is node_ending(cache, 11, 100)  # least recent first


def test_a_hit_through_an_abandoned_tail_revives_it():
    policy = trusting()
    cache = make_cache(hybrid_spec(), eviction=policy)
    cache.serve(seq(0, 20), toks(900), owner=1)
    cache.serve(seq(0, 12).concat(toks(500, 501)), toks(901), owner=2)
    tail = node_ending(cache, 21, 12)
    assert policy.bypass.goes_first(tail)
    # the owner of the tail comes back and continues it (a chat turn, not an agent rewrite)
    hit = cache.serve(seq(0, 20).concat(toks(900, 7, 8)), toks(902), owner=3)
    assert hit.hit_tokens == 21
    assert not policy.bypass.goes_first(tail)
    cache.check_integrity()


def test_control_tails_measure_revival():
    learner_ = BypassLearner(control_every=2, min_resolved=2, max_revival=0.5)
    policy = JengaEviction(alpha=0.0)
    policy.bypass = learner_
    cache = make_cache(hybrid_spec(), eviction=policy)
    for base in (0, 1000, 2000, 3000):
        cache.serve(seq(base, 20), toks(900), owner=base)
        cache.serve(seq(base, 12).concat(toks(500, 501)), toks(901), owner=base + 1)
    controls = [n for n in learner_.marked() if n.id in learner_._control]
    assert controls  # some tails are control: they keep the ordinary order
    assert not any(learner_.goes_first(n) for n in controls)
    for node in controls:
        cache.tree.evict_leaf(node)  # control tails die unrevived
    assert learner_.dead == len(controls)
    assert learner_.trusted == (len(controls) >= 2)
    cache.check_integrity()


def test_divergences_after_a_few_shared_tokens_are_not_learned():
    # a new conversation leaving another after the chat template's opening tokens
    admission = learner(min_branch_tokens=10)
    for _ in range(8):
        admission.plan(Branch(5, False, False, tail=300), 1000, 1100, 0)
    assert admission.predicted_tails() is None


def test_short_shared_divergences_mark_no_tail():
    policy = JengaEviction(alpha=0.0)
    cache = make_cache(hybrid_spec(), eviction=policy)
    policy.bypass.min_shared = 13
    cache.serve(seq(0, 20), toks(900), owner=1)
    cache.serve(seq(0, 12).concat(toks(500, 501)), toks(901), owner=2)  # shared 12 < 13
    assert policy.bypass.marked() == []
    cache.serve(seq(0, 16).concat(toks(600)), toks(902), owner=3)  # shared 16
    assert [n.end for n in policy.bypass.marked()] == [21]
