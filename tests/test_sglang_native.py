"""SGLang's own cache as a baseline: the static split, the runner's checks, and hand-checked hits
of SGLang's real UnifiedRadixCache driven through its scheduler helpers (page size 1,
extra_buffer strategy: a prefill tracks one state, at its end floored to the 64-token grid or
at the match's branch point instead; decode tracks every 256 tokens)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jenga_sglang.bench.drivers.sglang_split import static_split
from jenga_sglang.bench.runs.runner import RunConfig, run, validate
from jenga_sglang.bench.traces.trace import Request, write_trace
from jenga_sglang.models.presets import get_spec

GB = 10**9
SPEC = get_spec("marconi-7b")


def test_static_split_hand_computed() -> None:
    # 2 GB x 0.9 / 1.9 = 947.37 MB for states of 26 787 840 B: 35 fit, one is padding -> 34;
    # (2e9 - 35 x 26 787 840) // 65 536 = 16 211 KV tokens.
    split = static_split(SPEC, 2 * GB)
    assert (split.mamba_slots, split.kv_tokens) == (34, 16211)
    assert split.kv_bytes + split.mamba_bytes <= 2 * GB
    assert split.kv_bytes + split.mamba_bytes + SPEC.kv_bytes_per_token > 2 * GB


@pytest.mark.parametrize("budget", [GB // 2, GB, 5 * GB, 10 * GB])
def test_static_split_follows_the_ratio(budget: int) -> None:
    split = static_split(SPEC, budget)
    share = budget * 0.9 / 1.9
    assert split.mamba_bytes <= share < split.mamba_bytes + SPEC.state_bytes
    assert split.kv_bytes + split.mamba_bytes <= budget


def test_static_split_rejects_tiny_budgets_and_attention_only_models() -> None:
    with pytest.raises(ValueError, match="too small"):
        static_split(SPEC, 100 * 10**6)
    with pytest.raises(ValueError, match="no Mamba"):
        static_split(get_spec("gpt-oss-20b"), GB)


@pytest.mark.parametrize(
    ("mode", "memory", "message"),
    [("engine", "bytes", "sequential"), ("sequential", "jenga", "memory")],
)
def test_native_runs_reject_what_they_do_not_model(mode: str, memory: str, message: str) -> None:
    config = RunConfig(
        "t.jsonl", "marconi-7b", 2.0, "", mode=mode, memory=memory, cache="sglang-native"
    )
    with pytest.raises(ValueError, match=message):
        validate(config)
    validate(RunConfig("t.jsonl", "marconi-7b", 2.0, "", cache="sglang-native-unified"))


# ---------------------------------------------------------------- the real SGLang stack


def _seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


@pytest.fixture(scope="module", params=[False, True], ids=["static", "unified"])
def native(request: pytest.FixtureRequest) -> Iterator[Any]:
    from jenga_sglang.bench.drivers.sglang_native import SglangNativeCache

    yield lambda: SglangNativeCache(
        SPEC, static_split(SPEC, GB // 2), 4096, 8192, unified=request.param
    )


@pytest.mark.sglang
def test_two_turns_hit_the_floored_prefill_state(native: Any) -> None:
    cache = native()
    turn0_in, turn0_out = _seq(1000, 300), _seq(5000, 100)
    assert cache.serve(turn0_in, turn0_out) == 0
    # Turn 0 tracked one state: its 300-token prefill floored to 256. Decode (tokens 300-398)
    # crossed no multiple of 256, and the tree keeps KV only up to a state.
    turn1_in = turn0_in + turn0_out + _seq(7000, 50)  # 450 tokens
    assert cache.serve(turn1_in, _seq(8000, 300)) == 256
    # Turn 1 prefilled 256..450: its state sits at 256 + 194 // 64 x 64 = 448; its decode
    # (KV of 450..748) crossed 512, where the result processor tracks another.
    assert cache.serve([*turn1_in, 1], [2]) == 448
    turn2_in = turn1_in + _seq(8000, 300) + _seq(9000, 20)
    assert cache.serve(turn2_in, [3]) == 512
    # The 3-token extend of turn 1 + [1] tracked nothing (under one 64-token chunk); turn 2
    # prefilled 512..770 and tracked 512 + 256 = 768: one chain of 768 tokens, 4 states.
    assert cache.usage()["kv_cached_tokens"] == 768
    assert cache.usage()["mamba_cached_states"] == 4


@pytest.mark.sglang
def test_a_branch_point_replaces_the_end_state(native: Any) -> None:
    cache = native()
    shared = _seq(1000, 200)
    assert cache.serve(shared + _seq(2000, 100), [5]) == 0  # state at 256 (past the fork)
    # B shares 200 tokens of KV but no state: hit 0. Its prefill tracks the branch point
    # 200 // 64 x 64 = 192 instead of its own end (one state per prefill).
    b_in = shared + _seq(3000, 100)
    assert cache.serve(b_in, [6]) == 0
    assert cache.serve(shared + _seq(4000, 80), [7]) == 192
    assert cache.serve([*b_in, 8], [9]) == 192  # B's end state was never taken


@pytest.mark.sglang
def test_requests_larger_than_the_kv_pool_are_not_served(native: Any) -> None:
    cache = native()
    too_long = cache.kv_capacity + 1
    assert cache.serve(_seq(0, too_long - 10), _seq(10**6, 10)) is None
    assert cache.usage()["kv_cached_tokens"] == 0


@pytest.mark.sglang
def test_runner_record_of_a_native_replay(tmp_path: Path) -> None:
    path = tmp_path / "two_turns.jsonl"
    t0_in, t0_out = _seq(1000, 300), _seq(5000, 100)
    t1_in = t0_in + t0_out + _seq(7000, 50)
    write_trace(path, [Request(0, 0, 0.0, t0_in, t0_out), Request(0, 1, 1.0, t1_in, [1, 2])])
    record = run(RunConfig(str(path), "marconi-7b", 0.5, "", cache="sglang-native"))
    assert (record["requests"], record["hit_tokens"]) == (2, 256)
    assert record["input_tokens"] == 750
    assert record["token_hit_rate"] == pytest.approx(256 / 750)
    assert record["sglang_mamba_slots"] == static_split(SPEC, GB // 2).mamba_slots


@pytest.mark.sglang
def test_via_sglang_our_backend_keeps_exact_states() -> None:
    from jenga_sglang.bench.drivers.sglang_native import SglangNativeCache

    cache = SglangNativeCache(SPEC, static_split(SPEC, GB // 2), 4096, 8192, True, "jenga")
    turn0_in, turn0_out = _seq(1000, 300), _seq(5000, 100)
    assert cache.serve(turn0_in, turn0_out) == 0
    # no_buffer: the finished request's live state sits after its last computed token,
    # input + output - 1 = 399 (SGLang never computes the last sampled token's KV).
    assert cache.serve(turn0_in + turn0_out + _seq(7000, 50), [1]) == 399


@pytest.mark.sglang
def test_runner_record_of_a_via_replay_matches_the_pure_one(tmp_path: Path) -> None:
    """Six 300-token chats (10 output tokens), then a second turn of the last, at 0.3 GB.

    One chat cached = its KV + a state = 309 (via) or 310 (pure) + 408.75 tokens of bytes.
    Pure: 0.3e9 B = 4577.6 tokens hold six chats (4312.5); the second turn's new state and 3
    tokens do not fit, so the oldest chat goes. Via: SGLang's unified pool reserves one state's
    bytes (4168.9 left) and a running request holds its live state: the sixth chat's state and
    KV need the oldest chat's bytes. Either way one node and one state are evicted, and the
    second turn hits its first turn (one token less through SGLang: the last sampled token
    never gets KV)."""
    path = tmp_path / "six_chats.jsonl"
    out = _seq(10**6, 10)
    chats = [Request(k, 0, float(k), _seq(1000 * (k + 1), 300), out) for k in range(6)]
    again = Request(5, 1, 9.0, [*chats[5].input_tokens, *out, 7, 8], [9])
    write_trace(path, [*chats, again])
    via = run(RunConfig(str(path), "marconi-7b", 0.3, "jenga", via="sglang"))
    pure = run(RunConfig(str(path), "marconi-7b", 0.3, "jenga"))
    for record, hit in ((via, 309), (pure, 310)):
        assert record["hit_tokens"] == hit
        assert (record["evicted_nodes"], record["evicted_states"]) == (1, 1)
        assert (record["alpha"], record["tunings"]) == (0.0, 0)
    assert via["sglang_end_kv_cached_tokens"] == 5 * 309 + 3
    assert via["sglang_end_mamba_cached_states"] == 6
