"""The chunk cut at planned branch points (binding/capture/prefill_cut.py), around a stand-in adder.

The stand-in `original` does what PrefillAdder's methods do to the fields the hooks read:
admit the request into `can_run_list` with `extend_end` set by the token budget, and name it
the chunked request when the budget truncated it. The live path (the real PrefillAdder in a
server) is exercised by tests/test_e2e_server.py.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from jenga_sglang.binding.capture.prefill_cut import (
    around_add_chunked_req,
    around_add_one_req,
    extra_buffer_cut,
)
from tests.test_binding_backend import _params

pytestmark = pytest.mark.sglang

CONTINUE, OTHER = "continue", "other"


@pytest.fixture(scope="module")
def jenga_cache() -> Any:
    from jenga_sglang.binding.cache.backend import JengaRadixCache
    from jenga_sglang.binding.options import JengaOptions
    from jenga_sglang.models import get_spec

    return JengaRadixCache(_params(True, 256), get_spec("nemotron-h-8b"), JengaOptions(True))


@pytest.fixture(scope="module")
def extra_buffer_cache() -> Any:
    from jenga_sglang.binding.cache.backend import JengaRadixCache
    from jenga_sglang.binding.options import JengaOptions
    from jenga_sglang.models import get_spec

    params = _params(True, 256, extra_buffer=True)
    return JengaRadixCache(params, get_spec("nemotron-h-8b"), JengaOptions(True))


def _adder(tree_cache: Any, chunk: int | None = 64) -> Any:
    adder = SimpleNamespace(
        tree_cache=tree_cache, rem_chunk_tokens=chunk, can_run_list=[], new_chunked_req=None
    )
    adder.budget_state = lambda: OTHER if adder.rem_chunk_tokens == 0 else CONTINUE
    return adder


def _admit(adder: Any, req: Any, *_a: Any, **_k: Any) -> str:
    """PrefillAdder's effect: extend by the chunk budget; truncated means chunked."""
    end = min(req.input_len, req.prefix_len + (adder.rem_chunk_tokens or req.input_len))
    req.extend_end = end
    adder.can_run_list.append(req)
    if end < req.input_len:
        adder.new_chunked_req = req
    if adder.rem_chunk_tokens is not None:
        adder.rem_chunk_tokens -= end - req.prefix_len
    return adder.budget_state()


def _req(prefix: int, branch: int | None, input_len: int = 100) -> Any:
    return SimpleNamespace(
        rid=f"cut-{prefix}-{branch}-{input_len}",
        prefix_len=prefix,
        mamba_branching_seqlen=branch,
        input_len=input_len,
        full_untruncated_fill_ids=[0] * input_len,
    )


def test_a_new_request_stops_at_its_branch_and_ends_the_round(jenga_cache: Any) -> None:
    adder, req = _adder(jenga_cache, chunk=500), _req(10, 70)
    cuts = jenga_cache.prefill_cuts
    result = around_add_one_req(_admit, adder, req, False, None)
    assert req.extend_end == 70  # not 100
    assert adder.new_chunked_req is req  # the rest runs as its next chunk
    assert adder.rem_chunk_tokens == 0 and result == OTHER  # nothing else joins this round
    assert jenga_cache.prefill_cuts == cuts + 1  # counted (jenga:prefill_cuts_total)


def test_no_cut_when_the_forward_captures_in_pass() -> None:
    from jenga_sglang.binding.cache.backend import JengaRadixCache
    from jenga_sglang.binding.options import JengaOptions
    from jenga_sglang.models import get_spec

    cache = JengaRadixCache(
        _params(True, 256), get_spec("nemotron-h-8b"), JengaOptions(True), inpass=True
    )
    adder, req = _adder(cache, chunk=500), _req(10, 70)
    assert around_add_one_req(_admit, adder, req, False, None) == CONTINUE
    assert req.extend_end == 100 and cache.prefill_cuts == 0


def test_a_continuing_chunk_stops_at_the_branch(jenga_cache: Any) -> None:
    adder, req = _adder(jenga_cache, chunk=64), _req(64, 70)
    assert around_add_chunked_req(lambda a, r: _admit(a, r) and None, adder, req) is req
    assert req.extend_end == 70 and adder.rem_chunk_tokens == 0


@pytest.mark.parametrize(
    ("req", "has_chunked", "chunk", "why"),
    [
        (_req(10, None), False, 500, "no branch planned"),
        (_req(10, 100), False, 500, "the branch is the prompt end: the chunk ends there anyway"),
        (_req(10, 90), False, 64, "the budget ends the chunk (at 74) before the branch"),
        (_req(70, 70), False, 500, "the branch is already cached"),
        (_req(10, 70), True, 500, "another request is mid-prefill: one chunked request at a time"),
        (_req(10, 70), False, None, "chunked prefill is off"),
    ],
)
def test_no_cut(jenga_cache: Any, req: Any, has_chunked: bool, chunk: int | None, why: str) -> None:
    adder = _adder(jenga_cache, chunk=chunk)
    end_by_budget = min(req.input_len, req.prefix_len + (chunk or req.input_len))
    around_add_one_req(_admit, adder, req, has_chunked, None)
    assert req.extend_end == end_by_budget, why


def test_other_caches_are_left_alone() -> None:
    adder, req = _adder(object(), chunk=500), _req(10, 70)
    around_add_one_req(_admit, adder, req, False, None)
    assert req.extend_end == 100 and adder.new_chunked_req is None


@pytest.mark.parametrize(
    ("start", "end", "branch", "cut", "why"),
    [
        (0, 256, 192, None, "on the grid and inside the chunk: SGLang tracks it there"),
        (0, 256, 256, None, "on the grid at the chunk end: tracked as the aligned end"),
        (0, 256, 150, 86, "off the grid: the next chunk starts at 150 - 64"),
        (0, 500, 300, 236, "the last start <= branch - 64 on the branch's grid"),
        (0, 100, 300, 44, "the branch lies beyond: realign where the budget ends the chunk"),
        (0, 40, 300, None, "no start on the branch's grid inside this chunk (300 = 44 mod 64)"),
        (64, 200, 384, 192, "on the grid but beyond the chunk: keep the next start on it"),
        (64, 192, 384, None, "the chunk already ends on the grid"),
        (10, 256, 60, None, "fewer than 64 tokens past the start: never trackable"),
        (70, 256, 70, None, "the branch is already cached"),
    ],
)
def test_extra_buffer_cut(start: int, end: int, branch: int, cut: int | None, why: str) -> None:
    assert extra_buffer_cut(start, end, branch, 64) == cut, why


def test_extra_buffer_cuts_to_the_grid_not_at_the_branch(extra_buffer_cache: Any) -> None:
    adder, req = _adder(extra_buffer_cache, chunk=500), _req(0, 150, input_len=300)
    result = around_add_one_req(_admit, adder, req, False, None)
    assert req.extend_end == 86  # a chunk ending at 150 would track 128
    assert adder.new_chunked_req is req and result == OTHER


def test_extra_buffer_leaves_the_last_chunk_to_the_prompt_end(extra_buffer_cache: Any) -> None:
    adder, req = _adder(extra_buffer_cache, chunk=500), _req(0, 300, input_len=300)
    assert around_add_one_req(_admit, adder, req, False, None) == CONTINUE
    assert req.extend_end == 300 and adder.new_chunked_req is None


def _waiting(rid: str, ids: list[int], prefix: int, extend_end: int | None = None) -> Any:
    return SimpleNamespace(
        rid=rid,
        prefix_len=prefix,
        extend_end=len(ids) if extend_end is None else extend_end,
        full_untruncated_fill_ids=ids,
    )


@pytest.fixture
def inpass_cache() -> Any:
    from jenga_sglang.binding.cache.backend import JengaRadixCache
    from jenga_sglang.binding.options import JengaOptions
    from jenga_sglang.models import get_spec

    return JengaRadixCache(
        _params(True, 256), get_spec("nemotron-h-8b"), JengaOptions(True), inpass=True
    )


def test_a_request_waits_for_the_checkpoint_an_admitted_one_captures(inpass_cache: Any) -> None:
    from jenga_sglang.binding.cache.plans import Planned
    from jenga_sglang.binding.capture.shared_prefill import should_wait

    system = list(range(10, 110))  # 100 shared tokens past the cached 20
    a = _waiting("a", system + [1] * 30, prefix=20)
    b = _waiting("b", system + [2] * 30, prefix=20)
    for r in (a, b):
        inpass_cache.plans.remember(r.rid, Planned((100, 130)))
    assert not should_wait(inpass_cache, a, [])  # nobody computes it this round
    assert should_wait(inpass_cache, b, [a])  # a captures 100 now: b hits it next round
    other = _waiting("c", [7] * 100 + [2] * 30, prefix=20)
    inpass_cache.plans.remember("c", Planned((100, 130)))
    assert not should_wait(inpass_cache, other, [a])  # same position, other tokens
    short = _waiting("d", system + [3] * 300, prefix=20)
    inpass_cache.plans.remember("d", Planned((100, 400)))
    assert not should_wait(inpass_cache, short, [a])  # 80 saved of 380: not worth a round
    same = _waiting("e", list(a.full_untruncated_fill_ids), prefix=20)
    inpass_cache.plans.remember("e", Planned((100, 130)))
    assert should_wait(inpass_cache, same, [a])  # the same prompt waits for the branch point
    inpass_cache.plans.remember("e", Planned((130,)))
    assert not should_wait(inpass_cache, same, [a])  # but not for its own end: no hit there
    a.extend_end = 90
    assert not should_wait(inpass_cache, b, [a])  # a's chunk stops before 100 this round


def test_two_new_requests_parting_after_a_shared_prefix_capture_it_once(
    inpass_cache: Any,
) -> None:
    from jenga_sglang.binding.cache.plans import Planned
    from jenga_sglang.binding.capture.shared_prefill import should_wait

    system = list(range(10, 410))  # 400 tokens nobody has cached: no tree node, no plan there
    a = _waiting("a", system + [1] * 60, prefix=0)
    b = _waiting("b", system + [2] * 60, prefix=0)
    for r in (a, b):
        inpass_cache.plans.remember(r.rid, Planned((460,)))  # the prompt end only
    assert should_wait(inpass_cache, b, [a])  # a computes [0, 400) now: b waits to hit 400
    assert inpass_cache.plans.get("a").positions == (400, 460)  # a captures where they part
    assert inpass_cache.shared_branches == 1
    assert should_wait(inpass_cache, b, [a]) and inpass_cache.shared_branches == 1  # once
    short = _waiting("c", system[:20] + [3] * 200, prefix=0)  # shares 20 tokens: not worth it
    inpass_cache.plans.remember("c", Planned((220,)))
    assert not should_wait(inpass_cache, short, [a])
    a.extend_end = 300  # a's chunk stops before they part: nothing to capture this round
    assert not should_wait(inpass_cache, b, [a])


def test_a_capture_still_in_flight_holds_a_sharing_request_back(inpass_cache: Any) -> None:
    from jenga_sglang.binding.cache.captures import PendingCaptures
    from jenga_sglang.binding.cache.plans import Planned
    from jenga_sglang.binding.capture.shared_prefill import should_wait

    slots = [3]
    inpass_cache.captures = PendingCaptures(lambda: slots.pop() if slots else None, print)
    system = list(range(10, 410))
    a_ids = system + [1] * 60
    inpass_cache.captures.plan([("a", 0, 460, (400,), a_ids)])  # scheduled, not yet taken
    b = _waiting("b", system + [2] * 60, prefix=0)
    inpass_cache.plans.remember("b", Planned((460,)))
    assert should_wait(inpass_cache, b, [])  # overlap: a's checkpoint has not run yet
    other = _waiting("c", [5] * 400 + [2] * 60, prefix=0)
    assert not should_wait(inpass_cache, other, [])  # same position, other tokens
    inpass_cache.captures.drop("a")  # a's capture left (taken or dropped): b goes
    assert not should_wait(inpass_cache, b, [])


def test_held_back_requests_give_back_their_staged_slot(inpass_cache: Any) -> None:
    from jenga_sglang.binding.cache.plans import Planned

    system = list(range(10, 110))
    a = _waiting("a", system + [1] * 30, prefix=20)
    pool = inpass_cache.req_to_token_pool
    slot = pool.mamba_allocator.alloc(1)
    b = _waiting("b", system + [2] * 30, prefix=20)
    b.kv = SimpleNamespace(
        mamba_cow_src_index=slot, mamba_needs_clear=False, holds_mamba=True, mamba_pool_idx=slot[0]
    )
    for r in (a, b):
        inpass_cache.plans.remember(r.rid, Planned((100, 130)))
    free_before = pool.mamba_allocator.available_size()
    adder = _adder(inpass_cache, chunk=500)
    adder.can_run_list.append(a)
    assert around_add_one_req(_admit, adder, b, False, None).name == "CONTINUE"
    assert adder.can_run_list == [a] and b.kv.mamba_pool_idx is None
    assert pool.mamba_allocator.available_size() == free_before + 1
    assert inpass_cache.held_back == 1


@pytest.mark.parametrize("extra_buffer", [False, True])
def test_prompt_end_of_a_request_that_does_not_decode(extra_buffer: bool) -> None:
    """Without decoding, the finish hands over the state at the end under no_buffer, but only
    SGLang's last tracked one under extra_buffer: there the end is captured in-pass."""
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    from jenga_sglang.binding.cache.backend import JengaRadixCache
    from jenga_sglang.binding.options import JengaOptions
    from jenga_sglang.models import get_spec

    params = _params(True, 256, extra_buffer=extra_buffer)
    cache = JengaRadixCache(params, get_spec("nemotron-h-8b"), JengaOptions(True), inpass=True)
    for rid, budget in (("prefix-only", 0), ("chat", 8)):
        req = SimpleNamespace(rid=rid, sampling_params=SimpleNamespace(max_new_tokens=budget))
        key = RadixKey(array("q", range(10, 110)))
        cache.match_prefix(MatchPrefixParams(key=key, req=req))
        planned = cache.plans.get(rid).positions
        assert planned == ((100,) if budget or extra_buffer else ()), (rid, planned)
