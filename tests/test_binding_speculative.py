"""Speculative decoding (issue #31) over our tree, through SGLang's own speculative steps.

Without a server, and so without a model's forward, these tests drive one engine
(tests/mamba_session.py: SGLang's pools, our `JengaRadixCache`) through what an NGRAM chain
verify does between the scheduler and the cache, so that every slot a step touches can be
read back; SGLang's code runs wherever it runs here:

* the draft over-allocation: `page_aligned_decode_alloc_lens` with the reserve SGLang computes
  for the configured drafts, then `alloc_for_spec_decode` (evicting from our tree if it must);
* the verify forward is emulated as in mamba_session (h <- h / 2 + t): it writes the state after
  each draft step into the pool's per-step scratch (`intermediate_ssm`, conv windows) and
  leaves the live slot alone, as the Mamba mixer's verify path does;
* acceptance: SGLang's `verify_tree_greedy_triton` (interpreted) on a chain;
* the commit: SGLang's `_verify_commit_step_indices` picks the last accepted step and, with
  extra_buffer, the step that crosses the track grid; the copy itself is the CPU interpreter
  mode's torch stand-in for `scatter_mamba_states_after_mtp_verify`, whose fused kernels refuse
  CPU tensors (jenga_sglang/cpu_speculative.py, what a CPU server runs);
* result processing: SGLang's `_mamba_prefix_cache_update` (extra_buffer bookkeeping) and
  `_mamba_can_cache_finished_req` (no_buffer: skip the insert when a stop lands inside an
  accepted run), then `release_kv_cache`.

The real verify forward (attention over the draft mask, the Mamba mixer's per-step kernels)
and a server's acceptance are tests/test_e2e_speculative.py's, against stock NGRAM.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from jenga_sglang.cpu_speculative import scatter_mamba_states_after_verify
from tests.mamba_session import Session, expected, load_sg, recur, tokens

pytestmark = pytest.mark.sglang

N = 3  # verify width: the root (last sampled token) and two drafts; the pool's draft tokens
GRID = 128  # mamba_track_grid(page 1) with --mamba-track-interval 128 (tests/_params)
WRONG = 500  # a token the target never predicts here (tokens() stays below 30)


@pytest.fixture(scope="module")
def sg() -> Any:
    base = load_sg()
    import torch
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton
    from sglang.srt.managers.schedule_batch import (
        FINISH_MATCHED_TOKEN,
        set_mamba_track_indices_from_reqs,
    )
    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor,
    )
    from sglang.srt.mem_cache.allocation import alloc_for_spec_decode
    from sglang.srt.mem_cache.allocation_sizing import (
        get_alloc_reserve_per_decode,
        page_aligned_decode_alloc_lens,
    )
    from sglang.srt.runtime_context import get_context
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_utils import _verify_commit_step_indices

    return SimpleNamespace(
        **vars(base),
        FINISH_MATCHED_TOKEN=FINISH_MATCHED_TOKEN,
        Processor=SchedulerBatchResultProcessor,
        SpeculativeAlgorithm=SpeculativeAlgorithm,
        alloc_for_spec_decode=alloc_for_spec_decode,
        commit_step_indices=_verify_commit_step_indices,
        get_context=get_context,
        page_aligned_decode_alloc_lens=page_aligned_decode_alloc_lens,
        reserve=get_alloc_reserve_per_decode,
        set_mamba_track_indices_from_reqs=set_mamba_track_indices_from_reqs,
        verify_greedy=verify_tree_greedy_triton,
        long=torch.long,
    )


def _speculating(sg: Any, session: Session) -> Iterator[Session]:
    """`session` with `--speculative-algorithm NGRAM` and `N` draft tokens in SGLang's config
    (published after the session's pools, which every Session publishes afresh)."""
    names = ("speculative_algorithm", "speculative_num_draft_tokens")
    names += ("speculative_num_steps", "speculative_eagle_topk")
    ctx = sg.get_context()
    ctx.override("tests.speculative", **dict(zip(names, ("NGRAM", N, N - 1, 1), strict=True)))
    try:
        yield session
    finally:
        ctx.override("tests.speculative", **dict.fromkeys(names))


@pytest.fixture()
def s(sg: Any) -> Iterator[Session]:
    yield from _speculating(sg, Session(sg))


@pytest.fixture()
def sx(sg: Any) -> Iterator[Session]:
    yield from _speculating(sg, Session(sg, extra_buffer=True))


def _batch(sg: Any, s: Session, req: Any) -> Any:
    """The ScheduleBatch fields the verify step and result processing read (one request)."""
    torch = sg.torch
    batch = SimpleNamespace(
        reqs=[req],
        req_pool_indices=torch.tensor([req.kv.req_pool_idx], dtype=sg.long),
        req_to_token_pool=s.pool,
        tree_cache=s.cache,
        seq_lens=torch.tensor([req.kv.kv_committed_len], dtype=sg.long),
        spec_algorithm=sg.SpeculativeAlgorithm.from_string("NGRAM"),
        mamba_track_indices=None,
        mamba_track_buffer_indices=None,
    )
    if s.extra_buffer:  # prepare_mamba_track_for_verify
        sg.set_mamba_track_indices_from_reqs(batch)
    return batch


def _allocate(sg: Any, s: Session, batch: Any) -> None:
    """eagle_prepare_for_decode's KV over-allocation for the next verify."""
    torch = sg.torch
    cur, nxt, need = sg.page_aligned_decode_alloc_lens(
        batch.reqs, reserve=sg.reserve(), page_size=1
    )
    sg.alloc_for_spec_decode(
        s.cache,
        s.pool,
        reqs=batch.reqs,
        req_pool_indices=batch.req_pool_indices,
        cur_kv_lens=torch.tensor(cur),
        cur_kv_lens_cpu=torch.tensor(cur),
        nxt_kv_lens=torch.tensor(nxt),
        nxt_kv_lens_cpu=torch.tensor(nxt),
        num_needed_tokens=need,
    )


def verify(sg: Any, s: Session, req: Any, drafts: Sequence[int], truth: Sequence[int]) -> Any:
    """One verify round of the chain [root, *drafts] for `req` whose greedy outputs are `truth`
    (`truth[k]` is output k). Returns the round's result as the processor sees it."""
    torch = sg.torch
    assert len(drafts) == N - 1
    batch = _batch(sg, s, req)
    _allocate(sg, s, batch)
    k = len(req.output_ids) - 1  # the root is output k, sampled but not yet in KV or state
    chain = [req.output_ids[-1], *drafts]
    mc = s.pool.mamba_pool.mamba_cache
    state = s._state(int(req.kv.mamba_pool_idx))
    for step, token in enumerate(chain):  # the verify forward's per-step scratch
        state = recur(state, [token])
        mc.intermediate_ssm[:, 0, step] = state.to(mc.intermediate_ssm.dtype)
        for window in mc.intermediate_conv_window:
            window[:, 0, step] = state.to(window.dtype)
    target = torch.tensor([[truth[k + 1 + step] for step in range(N)]])
    accept_index = torch.full((1, N), -1, dtype=torch.int32)
    correct = torch.empty((1,), dtype=torch.int32)
    predict = torch.zeros(N, dtype=torch.int32)
    sg.verify_greedy(
        predict,
        accept_index,
        correct,
        torch.tensor([chain]),
        torch.tensor([list(range(N))]),
        torch.tensor([[*range(1, N), -1]]),
        torch.full((1, N), -1),
        target,
    )
    accept_lens = correct + 1
    last, track_steps = sg.commit_step_indices(
        batch=batch, accept_index=accept_index, accept_lens=accept_lens, draft_token_num=N
    )
    live = torch.tensor([int(req.kv.mamba_pool_idx)])
    scatter_mamba_states_after_verify(mc, live, last, batch.mamba_track_indices, track_steps)
    accepted = int(accept_lens[0])
    req.output_ids.extend(int(t) for t in predict[accept_index[0, :accepted].long()])
    req.kv.kv_committed_len += accepted
    result = SimpleNamespace(
        num_correct_drafts_per_req_cpu=[accepted - 1],
        num_non_draft_tokens_per_req=1,
        grammar_retained_tokens=None,
    )
    _processor(sg, s)._mamba_prefix_cache_update(req, batch, result, 0)
    return result


def _processor(sg: Any, s: Session) -> Any:
    """SGLang's result processor methods over a stand-in scheduler holding our cache."""
    proc = SimpleNamespace(tree_cache=s.cache)
    for name in ("_mamba_prefix_cache_update", "_mamba_check_track_boundary"):
        method = getattr(sg.Processor, name)
        setattr(proc, name, method.__get__(proc))
    proc._mamba_can_cache_finished_req = sg.Processor._mamba_can_cache_finished_req.__get__(proc)
    return proc


def finish(sg: Any, s: Session, req: Any, result: Any, stop_at: int | None = None) -> None:
    """The request finishes after the round that gave `result`; `stop_at`: a stop token
    matched at that output, inside the run the round accepted."""
    if stop_at is None:
        req.finished_reason = sg.FINISH_LENGTH(length=len(req.output_ids))
    else:
        req.finished_reason = sg.FINISH_MATCHED_TOKEN(matched=req.output_ids[stop_at])
        req.finished_len = stop_at + 1
    if not _processor(sg, s)._mamba_can_cache_finished_req(req, result, 0):
        req.skip_radix_cache_insert = True
    sg.release_kv_cache(req, s.cache, checkpoint=True)


def _kv_balance(s: Session) -> None:
    """Every KV slot is free or held by the tree: nothing a draft took is left behind."""
    held = sum(len(pages.ids()) for n in s.cache.cache.tree.nodes() for pages in n.kv)
    assert s.alloc.available_size() + held == s.alloc.size


def _drafts(truth: Sequence[int], k: int, good: int) -> list[int]:
    """Drafts after output k: the first `good` right, the rest wrong."""
    return [truth[k + 1 + j] if j < good else WRONG for j in range(N - 1)]


def test_accepted_states_reach_the_tree_as_in_plain_decoding(sg: Any, s: Session) -> None:
    """Rounds accepting 2, 0 and 1 drafts (outputs 0..6 after the prefill's first): the tree
    then holds what plain decoding of the same outputs leaves, state for state, and no
    rejected draft's KV or state."""
    a, truth = tokens(0, 50), tokens(3, 12)
    req = s.admit(a, 20)
    s.prefill(req, truth[0])
    result = None
    for good in (2, 0, 1):
        result = verify(sg, s, req, _drafts(truth, len(req.output_ids) - 1, good), truth)
        s.slots_balance(req)
    assert list(req.output_ids) == truth[:7]
    assert s.read(int(req.kv.mamba_pool_idx)) == expected(sg, a + truth[:6])
    finish(sg, s, req, result)

    plain = Session(sg)
    plain.serve(a, truth[:7])
    seq = a + truth[:7]
    assert s.cached_length(seq) == plain.cached_length(seq) == len(seq) - 1
    assert s.state_positions(seq) == plain.state_positions(seq)
    for pos in s.state_positions(seq):
        assert s.read(s.state_node(seq, pos).state.ids()[0]) == expected(sg, seq[:pos])
    assert s.cached_length([*a, truth[0], WRONG]) == len(a) + 1  # no rejected draft's KV
    s.slots_balance()
    _kv_balance(s)


def test_a_next_turn_resumes_from_the_verified_state(sg: Any, s: Session) -> None:
    """The second turn's prompt extends the first's outputs: it hits everything the first
    turn committed and starts from exactly the state verification left."""
    a, truth = tokens(0, 40), tokens(5, 12)
    req = s.admit(a, 20)
    s.prefill(req, truth[0])
    result = verify(sg, s, req, _drafts(truth, 0, 2), truth)
    result = verify(sg, s, req, _drafts(truth, 3, 1), truth)
    finish(sg, s, req, result)
    turn = a + truth[:6] + tokens(1, 10, base=2)
    hit, seeded = s.serve(turn, [7, 8])
    assert hit == len(a) + 5
    assert seeded == expected(sg, a + truth[:5])
    s.slots_balance()
    _kv_balance(s)


def test_a_stop_inside_an_accepted_run_caches_nothing_past_the_prefill(sg: Any, s: Session) -> None:
    """no_buffer: the round accepts two drafts but a stop token matched at the first of them;
    the live state is past the stop and cannot be shortened, so SGLang skips the insert and
    our tree keeps only what the prefill left; every slot and the drafts' KV come back."""
    a, truth = tokens(0, 50), tokens(3, 12)
    req = s.admit(a, 20)
    s.prefill(req, truth[0])
    before = s.state_positions(a)
    result = verify(sg, s, req, _drafts(truth, 0, 2), truth)
    finish(sg, s, req, result, stop_at=1)
    assert req.skip_radix_cache_insert
    assert s.state_positions(a + truth) == before
    assert s.cached_length(a + truth) == s.cached_length(a)
    s.slots_balance()
    _kv_balance(s)


def test_a_track_crossing_inside_a_verify_round_is_donated_at_the_grid(
    sg: Any, sx: Session
) -> None:
    """extra_buffer: the round verifying positions 127..129 crosses the 128 grid; SGLang
    picks the crossing step, the commit writes its state into the ping-pong slot, the
    bookkeeping records 128, and at finish the tree adopts that slot: the state after
    exactly 128 tokens, which a next turn resumes from."""
    s = sx
    a, truth = tokens(0, 126), tokens(3, 12)
    req = s.admit(a, 20)
    s.prefill(req, truth[0])
    result = verify(sg, s, req, _drafts(truth, 0, 2), truth)  # commits 126..128
    assert req.kv.kv_committed_len == 129
    assert req.kv.mamba_last_track_seqlen == GRID
    slot = s.track_slot(req, req.kv.mamba_last_track_idx)
    finish(sg, s, req, result)
    seq = a + truth[:4]
    node = s.state_node(seq, GRID)
    assert node.state.ids() == [slot]
    assert s.read(slot) == expected(sg, seq[:GRID])
    hit, seeded = s.serve([*seq, 9, 9, 9], [7, 8])
    assert (hit, seeded) == (GRID, expected(sg, seq[:GRID]))
    s.slots_balance()
    _kv_balance(s)
