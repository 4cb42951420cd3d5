"""The chunk cut at planned branch points (binding/prefill_cut.py), around a stand-in adder.

The stand-in `original` does what PrefillAdder's methods do to the fields the hooks read:
admit the request into `can_run_list` with `extend_end` set by the token budget, and name it
the chunked request when the budget truncated it. The live path (the real PrefillAdder in a
server) is exercised by tests/test_e2e_server.py.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from jenga_sglang.binding.prefill_cut import around_add_chunked_req, around_add_one_req
from tests.test_binding_backend import _params

pytestmark = pytest.mark.sglang

CONTINUE, OTHER = "continue", "other"


@pytest.fixture(scope="module")
def jenga_cache() -> Any:
    from jenga_sglang.binding.backend import JengaRadixCache
    from jenga_sglang.binding.options import JengaOptions
    from jenga_sglang.models import get_spec

    return JengaRadixCache(_params(True, 256), get_spec("nemotron-h-8b"), JengaOptions(True))


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
    return SimpleNamespace(prefix_len=prefix, mamba_branching_seqlen=branch, input_len=input_len)


def test_a_new_request_stops_at_its_branch_and_ends_the_round(jenga_cache: Any) -> None:
    adder, req = _adder(jenga_cache, chunk=500), _req(10, 70)
    result = around_add_one_req(_admit, adder, req, False, None)
    assert req.extend_end == 70  # not 100
    assert adder.new_chunked_req is req  # the rest runs as its next chunk
    assert adder.rem_chunk_tokens == 0 and result == OTHER  # nothing else joins this round


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
