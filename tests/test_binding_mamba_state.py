"""Mamba state hand-over through SGLang's own scheduler calls, on SGLang's real CPU pools.

A request is driven the way the scheduler drives it with `--mamba-radix-cache-strategy
no_buffer` (tests/mamba_session.py: the scheduler calls, and a "forward" that writes a
recurrence of the tokens into the request's live Mamba slot, so a slot's content names exactly
which prefix it is the state of). The extra_buffer strategy: test_binding_mamba_extra_buffer.py.
"""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from jenga_sglang.binding.cache.plans import Planned, RequestPlans
from tests.mamba_session import Session, expected, load_sg, tokens

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def sg() -> Any:
    return load_sg()


def test_two_turns_hand_state_over(sg: Any) -> None:
    s = Session(sg)
    a, out1 = tokens(0, 80), tokens(3, 5)
    hit, seeded = s.serve(a, out1)
    assert hit == 0 and seeded is None
    end1 = len(a) + len(out1) - 1  # the last sampled token never gets KV
    node = s.state_node(a + out1, end1)
    slot = node.state.ids()[0]
    assert s.read(slot) == expected(sg, (a + out1)[:end1])
    s.slots_balance()

    b = tokens(5, 30, base=60)
    second = s.admit(a + out1 + b, 3)
    assert second.prefix_len == end1
    assert int(second.kv.mamba_cow_src_index[0]) == slot
    assert int(second.kv.mamba_pool_idx) != slot  # its own live slot
    s.prefill(second, 1)
    # The live state continued from the seeded one: equals a from-scratch scan of turn 2.
    assert s.read(int(second.kv.mamba_pool_idx)) == expected(sg, a + out1 + b)
    assert s.read(slot) == expected(sg, (a + out1)[:end1])  # the source is untouched
    s.decode_and_finish(second, a + out1 + b, [1, 2, 3])
    assert s.cache.states_admitted == 2
    s.slots_balance()


def test_branch_state_captured_at_the_cut(sg: Any) -> None:
    s = Session(sg)
    a = tokens(0, 100)
    s.serve(a, [1, 2])
    c = a[:70] + tokens(9, 30, base=20)
    req = s.admit(c, 2)
    assert req.prefix_len == 0 and req.mamba_branching_seqlen == 70
    s.prefill(req, 5, cut_at=req.mamba_branching_seqlen)
    s.decode_and_finish(req, c, [5, 6])
    node = s.state_node(a, 70)
    assert node.state is not None
    assert s.read(node.state.ids()[0]) == expected(sg, a[:70])
    # A third request shares the 70 tokens: it starts from that checkpoint.
    d = a[:70] + tokens(11, 20, base=40)
    hit, seeded = s.serve(d, [4])
    assert hit == 70 and seeded == expected(sg, a[:70])
    s.slots_balance()


def test_without_the_cut_no_branch_state(sg: Any) -> None:
    """Chunks of 64 never end at 70: the running checkpoints cache KV only."""
    s = Session(sg)
    a = tokens(0, 100)
    s.serve(a, [1, 2])
    c = a[:70] + tokens(9, 30, base=20)
    s.serve(c, [5, 6])
    assert s.state_node(a, 70).state is None
    assert s.cache.states_admitted == 2  # the two finish states only
    s.slots_balance()


def test_prompt_end_state_is_captured_after_the_last_chunk(sg: Any) -> None:
    """The next turn repeats the prompt but re-renders the reply: it resumes at the prompt end."""
    s = Session(sg, prompt_end=True)
    a = tokens(0, 100)
    first = s.admit(a, 2)
    assert first.mamba_branching_seqlen == 100  # the only planned state: no cut needed
    s.prefill(first, 1)  # chunks end at 64 and 100
    s.decode_and_finish(first, a, [1, 2])
    node = s.state_node(a, 100)
    assert s.read(node.state.ids()[0]) == expected(sg, a)
    assert s.state_node([*a, 1], 101).state is not None  # and the finish state
    rendered = [*a, 9, 9, *tokens(4, 20, base=30)]  # the reply came back as 9 9
    hit, seeded = s.serve(rendered, [3, 4])
    assert hit == 100 and seeded == expected(sg, a)
    assert s.cache.states_admitted == 4  # prompt end and finish of each request
    assert s.state_node([*rendered, 3], len(rendered) + 1).state is not None
    s.slots_balance()


def test_each_planned_position_is_named_in_turn_and_captured(sg: Any) -> None:
    """A plan of several positions (the branch point and the prompt end, say): after each
    capture the backend names the next one, so the scheduler cuts there too."""
    s = Session(sg)
    a = tokens(0, 100)
    req = s.admit(a, 2)
    s.cache.plans.remember(req.rid, Planned((30, 50)))  # several planned positions
    req.mamba_branching_seqlen = 30
    s.prefill(req, 1, follow_plan=True)
    assert req.mamba_branching_seqlen is None  # nothing planned past 50
    s.decode_and_finish(req, a, [1, 2])
    for pos in (30, 50):
        node = s.state_node(a, pos)
        assert s.read(node.state.ids()[0]) == expected(sg, a[:pos])
    s.slots_balance()


def test_abort_gives_slots_back(sg: Any) -> None:
    s = Session(sg)
    a = tokens(0, 80)
    s.serve(a, [1, 2])
    req = s.admit([*a, 1, 2, 3], 2)
    assert req.kv.holds_mamba and req.prefix_len == 81
    s._alloc_kv(req, req.prefix_len, len(a) + 3)  # aborted after its prefill was scheduled
    req.finished_reason = sg.FINISH_LENGTH(length=0)
    sg.release_kv_cache(req, s.cache, checkpoint=False)
    assert not req.kv.holds_mamba
    s.slots_balance()


def test_a_hit_with_no_slot_to_copy_into_is_a_miss_not_a_crash(sg: Any) -> None:
    """Every Mamba slot but the cached one held by running requests: the hit's state has no
    live slot to go to, so the match reports no hit (SGLang's own component asserts), counts
    it, and the request is served from scratch once a slot is free again."""
    s = Session(sg)
    a = tokens(0, 80)
    s.serve(a, [1, 2])
    allocator = s.pool.mamba_allocator
    held = allocator.alloc(allocator.available_size())  # running requests' slots
    assert held is not None and allocator.available_size() == 0
    req = sg.Req(
        rid="late", origin_input_text="", origin_input_ids=array("q", [*a, 1, 2]),
        sampling_params=sg.SamplingParams(temperature=0, max_new_tokens=2),
    )  # fmt: skip
    req.init_next_round_input(s.cache)  # match_prefix(cow_mamba=True, req=req)
    assert req.prefix_len == 0 and not req.kv.holds_mamba
    assert req.kv.mamba_cow_src_index is None
    assert s.cache.unseeded == 1 and s.cache.snapshot().unseeded == 1
    assert s.cached_length([*a, 1, 2]) == 81  # the cached state stays for later hits
    allocator.free(held)
    s.cache.plans.pop(req.rid)
    again = s.admit([*a, 1, 2, 3], 2)
    assert again.prefix_len == 81 and again.kv.mamba_cow_src_index is not None


def test_plans_of_requests_that_never_finish_are_bounded() -> None:
    plans = RequestPlans(limit=100)
    for rid in range(110):  # e.g. aborted while queued: never released
        plans.remember(str(rid), Planned((5,)))
    assert len(plans) == 100
    assert "0" not in plans and "109" in plans
    plans.remember("50", Planned((7,)))  # re-matched: its newest plan, now the youngest
    for rid in range(110, 199):
        plans.remember(str(rid), Planned((5,)))
    assert plans.get("50") == Planned((7,)) and "51" not in plans
    assert plans.pop("50").positions == (7,) and plans.pop("50") == Planned()


def _rewriting(s: Session) -> Any:
    """Session `s`'s jenga policies, set to treat one rewrite as the common case."""
    admission = s.cache.cache.admission
    admission.min_samples, admission.min_branch_tokens = 1, 0
    return s.cache.cache.eviction


def test_a_rewriting_request_leaves_an_expendable_tail_without_a_finish_state(sg: Any) -> None:
    s = Session(sg, admission="jenga")
    eviction = _rewriting(s)
    a = tokens(0, 80)
    s.serve(a, [1, 2])
    b = a[:40] + tokens(5, 20, base=60)  # rewrites a from position 40 on
    hit, _ = s.serve(b, [3, 4], cut_at=40)
    assert hit == 0  # nothing checkpointed at 40 yet: it is captured now
    assert s.state_positions([*b, 3]) == [40]  # the branch state, none after the last token
    (tail,) = [n for n in s.cache.cache.tree.nodes() if n.start == 40 and n.key[0] == b[40]]
    assert eviction.victim() is tail  # expendable: before a's older entries
    s.slots_balance()


def test_the_ghost_names_a_branch_point_the_tree_evicted(sg: Any) -> None:
    s = Session(sg, admission="jenga")
    _rewriting(s)
    a = tokens(0, 80)
    s.serve(a, [1, 2])
    s.serve(a[:40] + tokens(5, 20, base=60), [3, 4], cut_at=40)  # learns: rewrites
    _evict_everything(s)
    assert s.cached_length(a) == 0
    c = a[:40] + tokens(5, 10, base=60) + tokens(2, 10, base=90)  # leaves b at 50
    req = s.admit(c, 2)
    assert req.prefix_len == 0 and req.mamba_branching_seqlen == 50
    s.prefill(req, 7, follow_plan=True)
    s.decode_and_finish(req, c, [7, 8])
    assert s.state_positions(c) == [50]
    s.slots_balance()


def _evict_everything(s: Session) -> None:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    s.cache.evict(EvictParams(num_tokens=10**6, mamba_num=10**6))
