"""Mamba state hand-over with `--mamba-radix-cache-strategy extra_buffer`, through SGLang's calls.

Driven like tests/test_binding_mamba_state.py (tests/mamba_session.py), with SGLang's extra
buffer: each request holds a live slot and two ping-pong track slots (overlap scheduling);
SGLang's own `_mamba_radix_cache_v2_req_prepare_for_extend` decides per prefill chunk which
position is tracked (`mamba_last_track_seqlen`: the last multiple of the 64-token Mamba chunk
counted from the chunk's start, or the planned branch point when it lies on that grid), and
decode tracks every `mamba_track_grid` = 128 tokens. The emulated forward writes the state after
exactly the tracked tokens into the ping-pong slot the pool names, so the tests read back which
prefix a slot adopted by the tree is the state of.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.mamba_session import Session, expected, load_sg, tokens

pytestmark = pytest.mark.sglang

GRID = 128  # mamba_track_grid(page 1) with --mamba-track-interval 128 (tests/_params)


@pytest.fixture(scope="module")
def sg() -> Any:
    return load_sg()


@pytest.fixture()
def s(sg: Any) -> Session:
    session = Session(sg, extra_buffer=True)
    assert sg.mamba_track_grid(1) == GRID and session.pool.mamba_ping_pong_track_buffer_size == 2
    return session


def _ping_pong(req: Any) -> list[int]:
    return [int(x) for x in req.kv.mamba_ping_pong_track_buffer.tolist()]


def test_finish_donates_the_state_tracked_in_decode(sg: Any, s: Session) -> None:
    """Decode crosses the track grid at 128: the finished request hands over that ping-pong
    slot (no copy); the tree keeps KV to the end and the state at exactly 128."""
    a, out = tokens(0, 100), tokens(3, 40)
    req = s.admit(a, len(out))
    s.prefill(req, out[0])
    s.slots_balance(req)
    base = len(a)
    s._alloc_kv(req, base, base + len(out) - 1)
    for k in range(1, len(out)):
        s._decode_step(req, out[k - 1], base + k)
        req.output_ids.append(out[k])
    assert req.kv.mamba_last_track_seqlen == GRID
    donated = _ping_pong(req)[req.kv.mamba_last_track_idx]
    req.finished_reason = sg.FINISH_LENGTH(length=len(out))
    sg.release_kv_cache(req, s.cache, checkpoint=True)

    node = s.state_node(a + out, GRID)
    assert node.state.ids() == [donated]
    assert s.read(donated) == expected(sg, (a + out)[:GRID])
    up_to = len(a) + len(out) - 1  # the last sampled token never gets KV
    assert s.cached_length(a + out) == up_to
    assert s.cache.states_admitted == 1
    s.slots_balance()


def test_finish_donates_the_state_tracked_in_prefill(sg: Any, s: Session) -> None:
    """Chunks [0,64) [64,128) [128,150) track 64 then 128; no planned position, so the running
    checkpoints donate nothing, and decode crosses no boundary. At finish the ping-pong slot
    still holds the state after 128 tokens: that is the request's latest tracked state."""
    a = tokens(0, 150)
    req = s.admit(a, 3)
    s.prefill(req, 1)
    assert req.kv.mamba_last_track_seqlen == GRID  # the chunk [128, 150) is too short to track
    s.slots_balance(req)
    s.decode_and_finish(req, a, [1, 2, 3])
    node = s.state_node([*a, 1, 2, 3], GRID)
    assert s.read(node.state.ids()[0]) == expected(sg, a[:GRID])
    assert s.cached_length([*a, 1, 2, 3]) == len(a) + 2
    s.slots_balance()


def test_finish_past_a_late_stop_falls_back_to_the_previous_tracked_state(
    sg: Any, s: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decode tracked 128 (prefill had tracked 64), but a stop string matched at output 20:
    the request keeps KV to 120 only, so it hands over the other ping-pong slot (state at 64,
    `mamba_prev_track_seqlen`) and the slot at 128 goes back to SGLang."""
    a, out = tokens(0, 100), tokens(3, 40)
    req = s.admit(a, len(out))
    s.prefill(req, out[0])
    base = len(a)
    s._alloc_kv(req, base, base + len(out) - 1)
    for k in range(1, len(out)):
        s._decode_step(req, out[k - 1], base + k)
        req.output_ids.append(out[k])
    assert (req.kv.mamba_prev_track_seqlen, req.kv.mamba_last_track_seqlen) == (64, GRID)
    latest = _ping_pong(req)[req.kv.mamba_last_track_idx]
    req.finished_reason = sg.FINISH_LENGTH(length=len(out))
    req.finished_len = 20  # what a stop-string match sets
    outputs = _spy_on_outputs(monkeypatch)
    sg.release_kv_cache(req, s.cache, checkpoint=True)
    assert s.cached_length(a + out) == base + 20
    assert outputs == [out[:20]]  # the admission remembers the outputs through the stop
    node = s.state_node(a + out, 64)
    assert s.read(node.state.ids()[0]) == expected(sg, a[:64])
    assert latest in s.pool.mamba_allocator.free_slots.tolist()
    s.slots_balance()


def test_second_turn_hits_at_the_tracked_position(sg: Any, s: Session) -> None:
    """Turn 2 extends turn 1: it hits at 128 (the tracked state, not the end of the cached KV),
    starts from that state, and tracks relative to its own prefix (128 + 64 = 192)."""
    a, out1 = tokens(0, 100), tokens(3, 40)
    s.serve(a, out1)
    b = tokens(5, 70, base=60)
    turn2 = a + out1 + b
    req = s.admit(turn2, 3)
    assert req.prefix_len == GRID
    cow = int(req.kv.mamba_cow_src_index[0])
    assert cow == s.state_node(a + out1, GRID).state.ids()[0]
    assert s.read(cow) == expected(sg, turn2[:GRID])
    assert int(req.kv.mamba_pool_idx) != cow and cow not in _ping_pong(req)
    s.slots_balance(req)
    s.prefill(req, 7)
    assert s.read(int(req.kv.mamba_pool_idx)) == expected(sg, turn2)
    assert req.kv.mamba_last_track_seqlen == GRID + 64
    s.decode_and_finish(req, turn2, [7, 8, 9])
    node = s.state_node([*turn2, 7, 8], GRID + 64)
    assert s.read(node.state.ids()[0]) == expected(sg, turn2[: GRID + 64])
    assert s.read(cow) == expected(sg, turn2[:GRID])  # the hit's state is untouched
    s.slots_balance()


def _branching_request(sg: Any, s: Session, branch: int) -> tuple[list[int], Any]:
    a = tokens(0, 300)
    s.serve(a, [1, 2])
    c = a[:branch] + tokens(9, 300 - branch, base=20)
    req = s.admit(c, 2)
    assert req.prefix_len == 0 and req.mamba_branching_seqlen == branch
    return c, req


def test_branch_on_the_track_grid_is_donated_at_the_running_checkpoint(sg: Any, s: Session) -> None:
    """Branch 192 lies inside the chunk [0, 256) on the 64-token grid: SGLang tracks it (the
    forced `h` read), and the checkpoint after that chunk donates the ping-pong slot, giving
    the request a fresh one in exchange."""
    s.chunk = 256
    c, req = _branching_request(sg, s, 192)
    before = _ping_pong(req)
    s.prefill(req, 5)
    after = _ping_pong(req)
    changed = [i for i in (0, 1) if before[i] != after[i]]
    assert len(changed) == 1  # the tracked entry was donated and refilled
    donated = before[changed[0]]
    node = s.state_node(c, 192)
    assert node.state.ids() == [donated]
    assert s.read(donated) == expected(sg, c[:192])
    s.slots_balance(req)
    s.decode_and_finish(req, c, [5, 6])
    s.slots_balance()


def test_branch_off_the_track_grid_is_not_donated(sg: Any, s: Session) -> None:
    """Branch 150 is not a multiple of 64 from the chunk start: SGLang tracks 256 instead, which
    is not planned, so the running checkpoint keeps the ping-pong slot (KV only at 150); the
    request's finish then hands over that tracked state at 256."""
    s.chunk = 256
    c, req = _branching_request(sg, s, 150)
    before = _ping_pong(req)
    s.prefill(req, 5)
    assert _ping_pong(req) == before
    assert s.state_node(c, 150).state is None
    assert req.kv.mamba_last_track_seqlen == 256
    s.decode_and_finish(req, c, [5, 6])
    assert s.read(s.state_node(c, 256).state.ids()[0]) == expected(sg, c[:256])
    s.slots_balance()


def _cut(s: Session) -> Any:
    from jenga_sglang.binding.capture.prefill_cut import cut_position

    return lambda req: cut_position(s.cache, req)


def _recording_cut(s: Session) -> tuple[list[int], Any]:
    """The cut rule, plus the list of where each chunk ended (cut or not)."""
    ends: list[int] = []
    cut = _cut(s)

    def record(r: Any) -> int | None:
        end = cut(r)
        ends.append(end or r.extend_end)
        return end

    return ends, record


def test_the_aligning_cut_makes_an_off_grid_branch_exact(sg: Any, s: Session) -> None:
    """prefill_cut's extra_buffer rule ends the first chunk at 86 = 150 - 64 (instead of 256),
    so the next chunk starts on the branch's grid: SGLang tracks 150 in it and the running
    checkpoint donates exactly the state after 150 tokens."""
    s.chunk = 256
    c, req = _branching_request(sg, s, 150)
    ends, record = _recording_cut(s)
    s.prefill(req, 5, cut=record)
    assert ends == [86, 300]
    node = s.state_node(c, 150)
    assert s.read(node.state.ids()[0]) == expected(sg, c[:150])
    s.decode_and_finish(req, c, [5, 6])
    s.slots_balance()


def test_prompt_end_is_realigned_only_in_a_chunk_that_ends_anyway(sg: Any) -> None:
    """With --jenga-prompt-end the prompt end (300) is planned. 300 - 0 is off the 64 grid:
    the first chunk, cut by the budget at 128, ends at 108 instead, and the last chunk
    [236, 300) then tracks 300 exactly. A one-chunk prompt is not cut (it would cost a round)."""
    s = Session(sg, prompt_end=True, extra_buffer=True)
    s.chunk = 128
    a = tokens(0, 300)
    req = s.admit(a, 2)
    assert req.mamba_branching_seqlen == 300
    ends, record = _recording_cut(s)
    s.prefill(req, 1, cut=record)
    assert ends == [108, 236, 300]
    assert s.read(s.state_node(a, 300).state.ids()[0]) == expected(sg, a)
    s.decode_and_finish(req, a, [1, 2])
    s.slots_balance()

    short = tokens(2, 100, base=40)  # fits one chunk: not cut, 100 is not tracked
    req = s.admit(short, 2)
    ends.clear()
    s.prefill(req, 1, cut=record)
    assert ends == [100]
    s.decode_and_finish(req, short, [1, 2])
    assert s.state_positions([*short, 1]) == [64]  # the finish hands over what was tracked
    s.slots_balance()


def test_abort_mid_prefill_gives_every_slot_back(sg: Any, s: Session) -> None:
    a = tokens(0, 200)
    s.serve(a, [1, 2])
    req = s.admit([*a, 1, 2, *tokens(4, 100, base=40)], 2)
    assert req.prefix_len == 192 and req.kv.holds_mamba  # turn 1 tracked 64, 128, 192
    s._extend(req, 192, 256)  # one chunk ran, tracked at 256
    assert req.kv.mamba_last_track_seqlen == 256
    s.slots_balance(req)
    req.finished_reason = sg.FINISH_LENGTH(length=0)
    sg.release_kv_cache(req, s.cache, checkpoint=False)
    assert not req.kv.holds_mamba and req.kv.mamba_ping_pong_track_buffer is None
    s.slots_balance()


def test_retraction_in_decode_gives_every_slot_back(sg: Any, s: Session) -> None:
    """SGLang's retraction (`release_req`: release without checkpoint, then
    `reset_for_retract`) in mid-decode hands nothing over and frees the live slot and both
    ping-pong slots; the tree keeps the KV of the running checkpoints."""
    from sglang.srt.managers.schedule_batch import release_req

    a, out = tokens(0, 100), tokens(3, 40)
    req = s.admit(a, len(out))
    s.prefill(req, out[0])
    base = len(a)
    s._alloc_kv(req, base, base + 30)
    for k in range(1, 31):
        s._decode_step(req, out[k - 1], base + k)
        req.output_ids.append(out[k])
    assert req.kv.mamba_last_track_seqlen == GRID
    s.slots_balance(req)
    release_req(
        req=req,
        remaing_req_count=1,
        req_to_token_pool=s.pool,
        token_to_kv_pool_allocator=s.alloc,
        tree_cache=s.cache,
        hisparse_coordinator=None,
    )
    req.reset_for_retract()
    assert s.cache.states_admitted == 0 and s.cached_length(a) == len(a)
    s.slots_balance()
    # Served again (as the scheduler would resubmit it), it ends with the right state.
    s.serve(a, out)
    assert s.read(s.state_node(a + out, GRID).state.ids()[0]) == expected(sg, (a + out)[:GRID])
    s.slots_balance()


def _spy_on_outputs(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Record the outputs a finished request hands the tree's `finish` (request_path.py
    packs them with `TokenSeq.of`)."""
    from jenga_sglang.binding.cache import request_path
    from jenga_sglang.radix.tokens import TokenSeq

    seen: list[list[int]] = []

    class Recording:
        @staticmethod
        def of(ids: Any) -> TokenSeq:
            seen.append(list(ids))
            return TokenSeq.of(ids)

    monkeypatch.setattr(request_path, "TokenSeq", Recording)
    return seen
