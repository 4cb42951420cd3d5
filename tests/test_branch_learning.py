"""Rewrites of history: ghost branch points and expendable tails (admission), abandoned and
expendable tails (eviction), on small hand-built trees."""

from __future__ import annotations

import pytest
from radix_helpers import hybrid_spec, make_cache, seq, toks

from jenga_sglang.policies.branching import BranchLearningAdmission
from jenga_sglang.policies.bypass import BypassLearner
from jenga_sglang.policies.eviction import JengaEviction
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.contracts import Branch
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.tokens import TokenSeq


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
    args: dict[str, object] = {"min_samples": 4, "window": 8, "ghost_tokens": 10_000}
    args.update(kw)
    return BranchLearningAdmission(**args)  # type: ignore[arg-type]


def rewrite(admission: BranchLearningAdmission, times: int) -> None:
    """`times` requests that left the sequence they extended 300 tokens before its end."""
    for _ in range(times):
        admission.plan(Branch(1000, False, False, tail=300), 2000, 2100, 900)


def test_rewrites_become_the_common_case_after_enough_samples():
    admission = learner(min_samples=4, min_rate=0.5)
    rewrite(admission, 3)
    assert not admission.rewriting
    rewrite(admission, 1)
    assert admission.rewriting
    for _ in range(5):  # requests continuing at the end of a leaf: chat turns
        admission.plan(Branch(2100, True, True, fanout=0), 2500, 2600, 2100)
    assert not admission.rewriting  # 3 of the last 8 left mid-edge


def test_a_rewriting_request_keeps_its_branch_state_and_nothing_past_it():
    admission = learner(prompt_end=True)
    rewrite(admission, 4)
    # resumed at 1000 and left the cached sequence at 1500: the next request resumes there
    plan = admission.plan(Branch(1500, False, False, tail=250), 3000, 3100, 1000)
    assert plan.prefill_at == (1500,)  # no prompt-end state past it
    assert plan.finish_at == ()  # no state after the last decoded token
    assert plan.expendable_from == 1500 and plan.cache_len == 3100


def test_chat_plans_are_speculative_admission_s():
    admission = learner()
    for _ in range(8):
        admission.plan(Branch(500, True, True, fanout=0), 1000, 1100, 500)
    assert not admission.rewriting
    plan = admission.plan(Branch(700, False, False, tail=50), 1000, 1100, 500)
    assert (plan.prefill_at, plan.finish_at, plan.expendable_from) == ((700,), (1100,), None)


def test_without_a_ghost_nothing_is_expendable():
    # the next request needs the tail to find its own branch point in the tree
    admission = learner(ghost_tokens=0)
    rewrite(admission, 8)
    assert admission.rewriting
    plan = admission.plan(Branch(1500, False, False, tail=250), 3000, 3100, 1000)
    assert plan.expendable_from is None and plan.finish_at == (3100,)


def test_recall_prefers_a_deeper_ghost_branch_inside_a_remembered_sequence():
    admission = learner()
    history = seq(0, 3000)
    admission.finished(history)
    tree_branch = Branch(400, True, True, fanout=5)  # evicted: only the shared prompt is left
    rewritten = seq(0, 1800).concat(toks(7, 7, 7))
    assert admission.recall(rewritten, tree_branch) is tree_branch  # no rewrites seen yet
    rewrite(admission, 4)
    ghost = admission.recall(rewritten, tree_branch)
    assert (ghost.length, ghost.at_node_end, ghost.checkpointed, ghost.tail) == (
        1800,
        False,
        False,
        1200,
    )
    assert admission.plan(ghost, 1803, 1900, 400).prefill_at == (1800,)  # captured exactly
    # continuing at the remembered end (a chat turn) or sharing less: the tree's branch
    assert admission.recall(history.concat(toks(7)), tree_branch) is tree_branch
    assert admission.recall(seq(0, 300).concat(toks(7)), tree_branch) is tree_branch
    assert learner(ghost_tokens=0).recall(rewritten, tree_branch) is tree_branch


def test_branch_learning_admission_rejects_bad_parameters():
    with pytest.raises(ValueError):
        BranchLearningAdmission(min_rate=1.5)
    with pytest.raises(ValueError):
        BranchLearningAdmission(ghost_tokens=-1)


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
    assert not admission.rewriting


def test_short_shared_divergences_mark_no_tail():
    policy = JengaEviction(alpha=0.0)
    cache = make_cache(hybrid_spec(), eviction=policy)
    policy.bypass.min_shared = 13
    cache.serve(seq(0, 20), toks(900), owner=1)
    cache.serve(seq(0, 12).concat(toks(500, 501)), toks(901), owner=2)  # shared 12 < 13
    assert policy.bypass.marked() == []
    cache.serve(seq(0, 16).concat(toks(600)), toks(902), owner=3)  # shared 16
    assert [n.end for n in policy.bypass.marked()] == [21]


# ---------------------------------------------------------------- expendable tails, end to end


def rewriting_cache(budget: int = 10**6) -> PrefixCache:
    admission = learner(min_samples=1, window=4)
    return make_cache(hybrid_spec(), budget, eviction=JengaEviction(alpha=0.0), admission=admission)


def test_a_rewriting_request_s_tail_goes_first_and_keeps_no_finish_state():
    cache = rewriting_cache()
    cache.serve(seq(100, 10), toks(990), owner=0)  # an older, unrelated sequence
    cache.serve(seq(0, 40), toks(900), owner=1)  # request k
    # request k + 1 leaves it at 20 (a rewrite): state at 20, its own tail past 20 expendable
    cache.serve(seq(0, 20).concat(toks(500, 501)), toks(901), owner=2)
    tail = node_ending(cache, 23, 500)
    assert tail.state is None  # no state after its last decoded token
    assert node_ending(cache, 20, 0).state is not None  # the branch checkpoint
    assert cache.eviction.victim() is tail  # before the older sequence and k's bypassed tail
    cache.check_integrity()


def test_a_state_checkpointed_on_an_expendable_node_revives_it():
    cache = rewriting_cache()
    policy = cache.eviction
    assert isinstance(policy, JengaEviction)
    cache.serve(seq(0, 40), toks(900), owner=1)
    cache.serve(seq(0, 20).concat(toks(500, 501)), toks(901), owner=2)
    tail = node_ending(cache, 23, 500)
    assert policy.victim() is tail
    # a request continues request k + 1 at its end (no rewrite this time): state at 23 ...
    cont = seq(0, 20).concat(toks(500, 501, 901, 7, 8))
    cache.serve(cont, toks(902), owner=3)
    assert tail.state is not None  # the prediction was wrong: the node is ordinary again
    assert policy.revived_expendable == 1
    assert policy.victim() is not tail
    assert cache.serve(cont.concat(toks(902, 9)), toks(903), owner=4).hit_tokens == 26
    cache.check_integrity()


def test_a_hit_through_an_expendable_node_revives_it():
    cache = rewriting_cache()
    policy = cache.eviction
    assert isinstance(policy, JengaEviction)
    a = seq(0, 30)
    cache.serve(a, toks(900), owner=1)  # one leaf [0, 31), its state at 31
    assert not any(n.end == 10 for n in cache.tree.nodes())
    cache.tree.chain_below(a.concat(toks(900)), 10)  # a stateless node [0, 10) above it
    upper = node_ending(cache, 10, 0)
    policy.expend([upper])
    assert policy.revived_expendable == 0
    hit = cache.serve(a.concat(toks(900, 5)), toks(901), owner=2)  # resumes at 31, through it
    assert hit.hit_tokens == 31 and policy.revived_expendable == 1
    cache.check_integrity()


def test_the_ghost_finds_the_branch_point_of_an_evicted_history():
    cache = rewriting_cache()
    cache.serve(seq(0, 40), toks(900), owner=1)
    cache.serve(seq(0, 20).concat(toks(500, 501)), toks(901), owner=2)  # learns: rewrites
    while cache.tree.root.children:  # the whole history is evicted
        assert cache.tree.evict_for(cache.tree.kv_types[0])
    # request k + 2 rewrites request k + 1 at 21: the tree knows nothing, the ghost does
    served = cache.serve(seq(0, 20).concat(toks(500, 77, 78)), toks(902), owner=3)
    assert served.hit_tokens == 0 and served.states_planned == 1
    assert node_ending(cache, 21, 0).state is not None  # captured exactly at the branch
    assert cache.admission.ghost_branches == 1  # type: ignore[attr-defined]
    cache.check_integrity()


def test_chain_below_splits_at_the_position_and_refuses_shared_tails():
    cache = make_cache(hybrid_spec())
    a = seq(0, 30)
    cache.serve(a, toks(900), owner=1)
    key = a.concat(toks(900))
    chain = cache.tree.chain_below(key, 12)
    assert [(n.start, n.end) for n in chain] == [(12, 31)]
    assert node_ending(cache, 12, 0).end == 12  # split there
    cache.serve(seq(0, 20).concat(toks(5)), toks(901), owner=2)  # forks at 20, below 12
    assert cache.tree.chain_below(key, 12) == []  # another sequence passes there
    assert cache.tree.chain_below(key, 0) == [] and cache.tree.chain_below(key, 31) == []
    cache.check_integrity()


def test_two_caches_on_the_same_agent_stream_make_the_same_decisions():
    """Tensor-parallel ranks run one cache each: the ghost, the rewrite statistics and the
    expendable order must be as deterministic as the rest (logical clock, ids, no hashing of
    objects)."""
    from jenga_sglang.bench.traces.agent import AgentParams, agent_trace
    from jenga_sglang.policies.bundles import build_cache, byte_budget

    params = AgentParams(sessions=8, rate=2.0, min_turns=20, max_turns=24, obs_median=60)
    trace = agent_trace(params)
    spec = hybrid_spec()
    logs = []
    for _ in range(2):
        cache, _ = build_cache("jenga", spec, byte_budget(spec, 200_000))
        cache.admission.min_samples = 4  # type: ignore[attr-defined]
        log = []
        for i, r in enumerate(trace):
            served = cache.serve(TokenSeq.of(r.input_tokens), TokenSeq.of(r.output_tokens), i)
            log.append((served, cache.tree.evicted_nodes, cache.tree.evicted_states))
        cache.check_integrity()
        eviction = cache.eviction
        assert isinstance(eviction, JengaEviction)
        ghost = cache.admission.ghost_branches  # type: ignore[attr-defined]
        logs.append((log, ghost, eviction.revived_expendable))
    assert logs[0] == logs[1]
    assert logs[0][1] > 0 and logs[0][0][-1][1] > 0  # the ghost and eviction were exercised
