"""Mamba state hand-over through SGLang's own scheduler calls, on SGLang's real CPU pools.

A request is driven the way the scheduler drives it with `--mamba-radix-cache-strategy
no_buffer`: `init_next_round_input` (match_prefix, copy-on-write of the hit's state), the tree
lock PrefillAdder takes, `alloc_req_slots`, per chunk `alloc_token_slots` + the deferred COW /
clear of `ScheduleBatch` + the model runner + a forward + `checkpoint_kv_cache`, decode steps,
and `release_kv_cache(checkpoint=True)`. The "forward" writes a deterministic recurrence of the
tokens into the request's live Mamba slot (every conv and temporal tensor), so a slot's content
names exactly which prefix it is the state of.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from tests.test_binding_backend import _params

pytestmark = pytest.mark.sglang

CHUNK = 64


@pytest.fixture(scope="module")
def sg() -> Any:
    import torch
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ScheduleBatch
    from sglang.srt.mem_cache.allocation import alloc_req_slots, alloc_token_slots
    from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
    from sglang.srt.sampling.sampling_params import SamplingParams

    return SimpleNamespace(
        torch=torch,
        FINISH_LENGTH=FINISH_LENGTH,
        Req=Req,
        ScheduleBatch=ScheduleBatch,
        alloc_req_slots=alloc_req_slots,
        alloc_token_slots=alloc_token_slots,
        checkpoint_kv_cache=checkpoint_kv_cache,
        release_kv_cache=release_kv_cache,
        SamplingParams=SamplingParams,
    )


def _recur(sg: Any, state: Any, tokens: Sequence[int]) -> Any:
    """The emulated SSM: h <- h / 2 + t per token (exact in float32 for small ints)."""
    for t in tokens:
        state = state * 0.5 + float(t)
    return state


def _expected(sg: Any, tokens: Sequence[int]) -> float:
    return float(_recur(sg, sg.torch.zeros((), dtype=sg.torch.float32), tokens))


class Session:
    """One engine: SGLang pools + our cache, serving requests as the scheduler does."""

    def __init__(self, sg: Any, admission: str = "speculative", prompt_end: bool = False) -> None:
        from jenga_sglang.binding.backend import JengaRadixCache
        from jenga_sglang.binding.options import JengaOptions
        from jenga_sglang.models import get_spec

        self.sg = sg
        params = _params(True, 1024)
        self.cache_params = params
        self.pool = params.req_to_token_pool
        self.alloc = params.token_to_kv_pool_allocator
        self.cache = JengaRadixCache(
            params,
            get_spec("nemotron-h-8b"),
            JengaOptions(enabled=True, admission=admission, prompt_end=prompt_end),
        )
        self.rid = 0

    # ------------------------------------------------------------------ pool contents

    def read(self, slot: int) -> float:
        """The state in `slot` (float32 temporal); every conv tensor must hold the same."""
        mc = self.pool.mamba_pool.mamba_cache
        value = mc.temporal[:, slot]
        assert bool((value == value.flatten()[0]).all()), f"slot {slot}: mixed temporal"
        for conv in mc.conv:
            assert bool((conv[:, slot] == value.flatten()[0].to(conv.dtype)).all())
        return float(value.flatten()[0])

    def _forward(self, slot: int, tokens: Sequence[int]) -> None:
        mc = self.pool.mamba_pool.mamba_cache
        state = _recur(self.sg, mc.temporal[:, slot].flatten()[0].float(), tokens)
        mc.temporal[:, slot] = state.to(mc.temporal.dtype)
        for conv in mc.conv:
            conv[:, slot] = state.to(conv.dtype)

    def _deferred_cow_and_clear(self, req: Any) -> None:
        """ScheduleBatch collects the COW / clear, the model runner applies it."""
        batch = SimpleNamespace()
        self.sg.ScheduleBatch._collect_deferred_mamba_cow_and_clear(batch, [req])
        if batch.mamba_clear_indices is not None:
            self.pool.mamba_pool.clear_slots(batch.mamba_clear_indices)
        if batch.mamba_cow_src_indices is not None:
            self.pool.copy_mamba_state(batch.mamba_cow_src_indices, batch.mamba_cow_dst_indices)

    # ------------------------------------------------------------------ serving

    def admit(self, inp: Sequence[int], max_new: int) -> Any:
        sg = self.sg
        self.rid += 1
        req = sg.Req(
            rid=str(self.rid),
            origin_input_text="",
            origin_input_ids=array("q", inp),
            sampling_params=sg.SamplingParams(temperature=0, max_new_tokens=max(1, max_new)),
        )
        req.init_next_round_input(self.cache)  # match_prefix(cow_mamba=True, req=req)
        req.lock = self.cache.lock(req.last_node)  # PrefillAdder.add_one_req
        sg.alloc_req_slots(self.pool, [req], self.cache)
        return req

    def prefill(
        self, req: Any, first_output: int, cut_at: int | None = None, follow_plan: bool = False
    ) -> None:
        """Chunks of CHUNK tokens; `cut_at` ends a chunk exactly there (the branch cut), and
        `follow_plan` ends one at each `req.mamba_branching_seqlen` (what prefill_cut does)."""
        total = len(req.origin_input_ids)
        while req.prefix_len < total:
            start = req.prefix_len
            end = min(start + CHUNK, total)
            if follow_plan:
                cut_at = req.mamba_branching_seqlen
            if cut_at is not None and start < cut_at < end:
                end = cut_at
            req.extend_end = end
            self._alloc_kv(req, start, end)
            self._deferred_cow_and_clear(req)
            self._forward(int(req.kv.mamba_pool_idx), req.origin_input_ids[start:end])
            if end == total:
                req.output_ids.append(first_output)
            self.sg.checkpoint_kv_cache(req, self.cache)

    def decode_and_finish(self, req: Any, inp: Sequence[int], out: Sequence[int]) -> None:
        base = len(inp)
        if len(out) > 1:
            self._alloc_kv(req, base, base + len(out) - 1)
        for k in range(1, len(out)):
            self._forward(int(req.kv.mamba_pool_idx), [out[k - 1]])
            req.kv.kv_committed_len = base + k
            req.output_ids.append(out[k])
        req.finished_reason = self.sg.FINISH_LENGTH(length=len(out))
        self.sg.release_kv_cache(req, self.cache, checkpoint=True)

    def serve(
        self, inp: Sequence[int], out: Sequence[int], cut_at: int | None = None
    ) -> tuple[int, float | None]:
        """Serve one request; returns its hit and the state its prefill started from."""
        req = self.admit(inp, len(out))
        hit = int(req.prefix_len)
        src = req.kv.mamba_cow_src_index
        seeded = None if src is None else self.read(int(src[0]))
        self.prefill(req, out[0], cut_at)
        self.decode_and_finish(req, inp, out)
        return hit, seeded

    def _alloc_kv(self, req: Any, start: int, end: int) -> None:
        loc = self.sg.alloc_token_slots(self.cache, end - start)
        self.pool.write((req.kv.req_pool_idx, slice(start, end)), loc)
        req.kv.kv_committed_len = end
        req.kv.kv_allocated_len = end

    def state_node(self, tokens: Sequence[int], pos: int) -> Any:
        from jenga_sglang.radix.tokens import TokenSeq

        for node in self.cache.cache.tree.walk(TokenSeq.of(list(tokens))).path:
            if node.end == pos:
                return node
        raise AssertionError(f"no node ends at {pos}")

    def slots_balance(self) -> None:
        """Every Mamba slot is free or held by the tree (no request runs)."""
        held = self.cache.memory.held(self.cache.state_type)
        free = self.pool.mamba_allocator.available_size()
        assert held + free == self.pool.mamba_pool.size
        self.cache.sanity_check()


def _tokens(start: int, n: int, base: int = 1) -> list[int]:
    """`n` small token ids; different `base`s never share a token."""
    return [base + (start + 7 * i) % 13 for i in range(n)]


def test_two_turns_hand_state_over(sg: Any) -> None:
    s = Session(sg)
    a, out1 = _tokens(0, 80), _tokens(3, 5)
    hit, seeded = s.serve(a, out1)
    assert hit == 0 and seeded is None
    end1 = len(a) + len(out1) - 1  # the last sampled token never gets KV
    node = s.state_node(a + out1, end1)
    slot = node.state.ids()[0]
    assert s.read(slot) == _expected(sg, (a + out1)[:end1])
    s.slots_balance()

    b = _tokens(5, 30, base=60)
    second = s.admit(a + out1 + b, 3)
    assert second.prefix_len == end1
    assert int(second.kv.mamba_cow_src_index[0]) == slot
    assert int(second.kv.mamba_pool_idx) != slot  # its own live slot
    s.prefill(second, 1)
    # The live state continued from the seeded one: equals a from-scratch scan of turn 2.
    assert s.read(int(second.kv.mamba_pool_idx)) == _expected(sg, a + out1 + b)
    assert s.read(slot) == _expected(sg, (a + out1)[:end1])  # the source is untouched
    s.decode_and_finish(second, a + out1 + b, [1, 2, 3])
    assert s.cache.states_admitted == 2
    s.slots_balance()


def test_branch_state_captured_at_the_cut(sg: Any) -> None:
    s = Session(sg)
    a = _tokens(0, 100)
    s.serve(a, [1, 2])
    c = a[:70] + _tokens(9, 30, base=20)
    req = s.admit(c, 2)
    assert req.prefix_len == 0 and req.mamba_branching_seqlen == 70
    s.prefill(req, 5, cut_at=req.mamba_branching_seqlen)
    s.decode_and_finish(req, c, [5, 6])
    node = s.state_node(a, 70)
    assert node.state is not None
    assert s.read(node.state.ids()[0]) == _expected(sg, a[:70])
    # A third request shares the 70 tokens: it starts from that checkpoint.
    d = a[:70] + _tokens(11, 20, base=40)
    hit, seeded = s.serve(d, [4])
    assert hit == 70 and seeded == _expected(sg, a[:70])
    s.slots_balance()


def test_without_the_cut_no_branch_state(sg: Any) -> None:
    """Chunks of 64 never end at 70: the running checkpoints cache KV only."""
    s = Session(sg)
    a = _tokens(0, 100)
    s.serve(a, [1, 2])
    c = a[:70] + _tokens(9, 30, base=20)
    s.serve(c, [5, 6])
    assert s.state_node(a, 70).state is None
    assert s.cache.states_admitted == 2  # the two finish states only
    s.slots_balance()


def test_prompt_end_state_is_captured_after_the_last_chunk(sg: Any) -> None:
    """The next turn repeats the prompt but re-renders the reply: it resumes at the prompt end."""
    s = Session(sg, prompt_end=True)
    a = _tokens(0, 100)
    first = s.admit(a, 2)
    assert first.mamba_branching_seqlen == 100  # the only planned state: no cut needed
    s.prefill(first, 1)  # chunks end at 64 and 100
    s.decode_and_finish(first, a, [1, 2])
    node = s.state_node(a, 100)
    assert s.read(node.state.ids()[0]) == _expected(sg, a)
    assert s.state_node([*a, 1], 101).state is not None  # and the finish state
    rendered = [*a, 9, 9, *_tokens(4, 20, base=30)]  # the reply came back as 9 9
    hit, seeded = s.serve(rendered, [3, 4])
    assert hit == 100 and seeded == _expected(sg, a)
    assert s.cache.states_admitted == 4  # prompt end and finish of each request
    assert s.state_node([*rendered, 3], len(rendered) + 1).state is not None
    s.slots_balance()


def test_each_planned_position_is_named_in_turn_and_captured(sg: Any) -> None:
    """A plan of several positions (learned branch predictions): after each capture the
    backend names the next one, so the scheduler cuts there too."""
    s = Session(sg)
    a = _tokens(0, 100)
    req = s.admit(a, 2)
    s.cache._planned[req.rid] = (30, 50)  # as a trained BranchLearningAdmission would plan
    req.mamba_branching_seqlen = 30
    s.prefill(req, 1, follow_plan=True)
    assert req.mamba_branching_seqlen is None  # nothing planned past 50
    s.decode_and_finish(req, a, [1, 2])
    for pos in (30, 50):
        node = s.state_node(a, pos)
        assert s.read(node.state.ids()[0]) == _expected(sg, a[:pos])
    s.slots_balance()


def test_abort_gives_slots_back(sg: Any) -> None:
    s = Session(sg)
    a = _tokens(0, 80)
    s.serve(a, [1, 2])
    req = s.admit([*a, 1, 2, 3], 2)
    assert req.kv.holds_mamba and req.prefix_len == 81
    s._alloc_kv(req, req.prefix_len, len(a) + 3)  # aborted after its prefill was scheduled
    req.finished_reason = sg.FINISH_LENGTH(length=0)
    sg.release_kv_cache(req, s.cache, checkpoint=False)
    assert not req.kv.holds_mamba
    s.slots_balance()


def test_plans_of_requests_that_never_finish_are_bounded(sg: Any) -> None:
    from jenga_sglang.binding import backend

    s = Session(sg)
    for rid in range(backend._MAX_PLANS + 10):  # e.g. aborted while queued: never released
        s.cache._remember_plan(str(rid), (5,))
    assert len(s.cache._planned) == backend._MAX_PLANS
    assert "0" not in s.cache._planned and str(backend._MAX_PLANS + 9) in s.cache._planned
