"""A PD decode worker's own radix cache (`--disaggregation-decode-enable-radix-cache`) with
`--enable-jenga`: every request's SSM state arrives from the prefill worker with its KV suffix
(models/spec.py `states_from_peer`), so a decode-side hit needs the KV alone, the tree keeps no
states, and each request's state slot goes back to SGLang's pool when it finishes.

Requests go through SGLang's own calls on its CPU pools (tests/mamba_session.py); the live
run over SGLang's Mooncake backend is tests/test_e2e_pd.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.mamba_session import Session, load_sg, tokens

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def sg() -> Any:
    return load_sg()


def test_hits_need_the_kv_alone_and_no_state_is_kept(sg: Any) -> None:
    decode = Session(sg, from_peer=True)
    first, out = tokens(0, 40), tokens(500, 6)
    assert decode.serve(first, out) == (0, None)
    held = [*first, *out[:-1]]  # the last output's KV is never computed
    assert decode.cached_length(held) == len(held)
    assert decode.state_positions(held) == []  # the request's state went back to the pool
    decode.slots_balance()
    # A fork inside the first request's edge and the session's next turn: KV hits where no
    # node ends and no state lies, never seeded from the tree (the peer sends the state).
    assert decode.serve([*first[:23], *tokens(900, 10)], tokens(700, 3)) == (23, None)
    assert decode.serve([*held, *tokens(300, 5)], tokens(800, 2)) == (len(held), None)
    decode.slots_balance()
    assert decode.cache.mamba_evictable_size() == 0 == decode.cache.mamba_protected_size()
    decode.cache.sanity_check()


def test_a_colocated_tree_on_the_same_requests_hits_only_at_its_states(sg: Any) -> None:
    """The rule is the spec's: the same requests through a tree that keeps states get no hit
    where no checkpoint lies."""
    colocated = Session(sg)
    first, out = tokens(0, 40), tokens(500, 6)
    colocated.serve(first, out)
    assert colocated.state_positions([*first, *out[:-1]]) != []
    hit, _ = colocated.serve([*first[:23], *tokens(900, 10)], tokens(700, 3))
    assert hit == 0


def test_the_tree_frees_kv_for_new_requests_when_full(sg: Any) -> None:
    """With no states to weigh, eviction makes KV room as a plain KV tree does, and every
    slot keeps one owner."""
    decode = Session(sg, from_peer=True, kv_size=160)
    prompts = [tokens(1000 * (i + 1), 40) for i in range(6)]  # 6 x 43 KV tokens > 160 slots
    for prompt in prompts:
        decode.serve(prompt, tokens(50, 4))
        decode.slots_balance()
    assert decode.cached_length(prompts[0]) == 0  # the oldest went for the newest
    assert decode.cached_length(prompts[-1]) == 40
    assert decode.cache.evictable_size() <= 160
    decode.cache.sanity_check()


def test_the_rule_is_the_specs_and_window_groups_are_refused() -> None:
    from jenga_sglang.binding.cache.compat import UnsupportedModelError
    from jenga_sglang.binding.cache.factory import check_decode_tree
    from jenga_sglang.models import get_spec
    from jenga_sglang.models.spec import states_from_peer

    spec = states_from_peer(get_spec("nemotron-h-8b"))
    assert spec.has_mamba and not spec.keeps_states
    assert spec.state_bytes == get_spec("nemotron-h-8b").state_bytes  # the pools' rows stay
    check_decode_tree(spec)
    with pytest.raises(ValueError, match="no SSM states"):
        states_from_peer(get_spec("gpt-oss-20b"))
    with pytest.raises(UnsupportedModelError, match=r"sliding-window groups \(sliding\)"):
        check_decode_tree(get_spec("gpt-oss-20b"))
