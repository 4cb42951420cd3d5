"""A request SGLang leaves waiting is matched again every scheduling round: its hit is counted
once, when the scheduler takes it (binding/cache/backend.py `_taken`), not once per match.

Counted per match, the next turn of a chat, waiting for room, made the state it was about to
resume from look superseded (one child, the last reply; hit) and eviction dropped that state
first, so the turn ran from the checkpoint before it (bench/RESULTS.md, "A waiting request's
hit, counted once")."""

from __future__ import annotations

from typing import Any

from tests.mamba_session import Session, load_sg

PROMPT = [1 + (i * 7) % 90 for i in range(60)]
REPLY = [200 + i for i in range(8)]
NEXT = PROMPT + [300 + i for i in range(30)]  # the next turn: the reply re-tokenized apart


def _waiting(s: Session, inp: list[int], rounds: int) -> Any:
    """A new request matched in `rounds` scheduling rounds that had no room for it: each
    round SGLang frees the Mamba slot its match seeded (scheduler.py, "not added")."""
    req = s.request(inp, 8)
    for _ in range(rounds):
        req.init_next_round_input(s.cache)
        assert int(req.prefix_len) == len(PROMPT)
        if req.kv.mamba_pool_idx is not None:
            s.pool.mamba_allocator.free(req.kv.mamba_pool_idx.unsqueeze(-1))
            req.kv.mamba_pool_idx = None
        req.kv.mamba_cow_src_index = None
    return req


def test_a_waiting_turn_is_counted_once_and_its_state_not_superseded() -> None:
    s = Session(load_sg(), admission="jenga", prompt_end=True)
    s.serve(PROMPT, REPLY)
    resume = s.state_node(NEXT, len(PROMPT))
    assert resume.state is not None and len(resume.children) == 1  # the reply below it

    req = _waiting(s, NEXT, rounds=3)
    s.take(req)
    assert int(req.prefix_len) == len(PROMPT)
    assert resume.hit_count == 1  # three waiting rounds and the admission: one hit
    s.cache.maybe_hand_to_session(req)  # a later extend of the same request
    assert resume.hit_count == 1
    s.prefill(req, 400)
    s.decode_and_finish(req, NEXT, [400, 401])
    s.cache.cache.check_integrity()
    assert s.cache.hit_tokens == len(PROMPT)


def test_waiting_rounds_keep_the_hit_warm_without_counting_it() -> None:
    """Between the rounds, before the scheduler takes it: the resume point has no hit, so the
    eviction policy still expects it to be reused (a host tier demotes it, not drops it)."""
    s = Session(load_sg(), admission="jenga", prompt_end=True)
    s.serve(PROMPT, REPLY)
    resume = s.state_node(NEXT, len(PROMPT))
    policy = s.cache.cache.tree.policy
    before = resume.last_access
    _waiting(s, NEXT, rounds=3)
    assert resume.hit_count == 0
    assert not policy.is_superseded(resume)
    assert policy.reuse_odds(resume) == 1.0
    assert resume.last_access > before  # warmed: SGLang keeps a waiting prefix recent too


def test_a_request_bound_without_prefix_device_indices_counts_its_hit_once() -> None:
    """A PD decode worker binds a request's prefix itself and only then calls
    `maybe_hand_to_session` (disaggregation/decode.py): the hit is counted there, once."""
    s = Session(load_sg(), admission="jenga", prompt_end=True)
    s.serve(PROMPT, REPLY)
    before = s.cache.hit_tokens
    req = _waiting(s, NEXT, rounds=2)
    assert s.cache.hit_tokens == before  # matched, not taken
    s.cache.maybe_hand_to_session(req)
    s.cache.maybe_hand_to_session(req)
    assert s.cache.hit_tokens == before + len(PROMPT)
    assert s.state_node(NEXT, len(PROMPT)).hit_count == 1
