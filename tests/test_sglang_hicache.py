"""SGLang's HiCache on CPU as the host tier's baseline (bench/drivers/sglang_hicache.py): its real
`init_hicache` stack over the static split, behind the CPU shim (no pinning, no byte copies,
slots moved counted), driven as the scheduler drives a host hit.

A 0.5 GB device (marconi-7b: 4,000 KV tokens, 8 Mamba slots) holds about three 1,000-token
sessions; five evict the first, which a host tier keeps for its second turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jenga_sglang.bench.runs.runner import RunConfig, run, validate
from jenga_sglang.bench.traces.trace import Request, write_trace

KV, STATE = 65536, 26787840  # marconi-7b


def _seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five sessions' first turns (1,000 + 50 tokens), then session 0's second turn."""
    path = tmp_path_factory.mktemp("hicache") / "five.jsonl"
    firsts = [(_seq(10_000 * s, 1000), _seq(10_000 * s + 5000, 50)) for s in range(5)]
    reqs = [Request(s, 0, float(s), inp, out) for s, (inp, out) in enumerate(firsts)]
    inp, out = firsts[0]
    reqs.append(Request(0, 1, 10.0, inp + out + _seq(90_000, 100), [1, 2]))
    write_trace(path, reqs)
    return path


def replay(trace: Path, cache: str, **fields: Any) -> dict[str, Any]:
    return run(RunConfig(str(trace), "marconi-7b", 0.5, "", cache=cache, **fields))


def test_hicache_needs_a_host_size_and_a_known_write_policy() -> None:
    hicache = "sglang-native-hicache"
    with pytest.raises(ValueError, match="--host-gb"):
        validate(RunConfig("t.jsonl", "marconi-7b", 1.0, "", cache=hicache))
    with pytest.raises(ValueError, match="write-policy"):
        validate(
            RunConfig(
                "t.jsonl", "marconi-7b", 1.0, "", cache=hicache, host_gb=4, hicache_write="lru"
            )
        )
    with pytest.raises(ValueError, match="--host-gb applies"):
        validate(RunConfig("t.jsonl", "marconi-7b", 1.0, "", cache="sglang-native", host_gb=4))


@pytest.mark.sglang
def test_the_first_session_comes_back_from_host(trace: Path) -> None:
    plain = replay(trace, "sglang-native")
    tiered = replay(trace, "sglang-native-hicache", host_gb=2.0)
    assert plain["hit_tokens"] == 0, "without host memory session 0 was evicted"
    # its state at 1,024 (decode tracks every 256 tokens) and the KV before it came back
    assert tiered["hit_tokens"] == tiered["host_hit_tokens"] == 1024
    # the KV and the state into the tree, and the state again into the request's own slot
    # (the copy-on-write SGLang makes of a matched state)
    assert tiered["host_load_bytes"] == 1024 * KV + 2 * STATE
    assert tiered["host_write_bytes"] > 5 * 1000 * KV, "write-through copied every first turn"
    # the host pools: --hicache-ratio 4 times each device pool (and one padding slot)
    assert tiered["host_kv_slots"] == 4 * tiered["sglang_kv_tokens"] + 1
    assert tiered["host_mamba_slots"] == 4 * tiered["sglang_mamba_slots"] + 1


@pytest.mark.sglang
def test_write_policies_differ_in_what_they_copy(trace: Path) -> None:
    through = replay(trace, "sglang-native-hicache", host_gb=2.0)
    back = replay(trace, "sglang-native-hicache", host_gb=2.0, hicache_write="write_back")
    selective = replay(
        trace, "sglang-native-hicache", host_gb=2.0, hicache_write="write_through_selective"
    )
    assert back["hicache_write"] == "write_back"
    # write-back copies only what device eviction demotes, and finds the same hit
    assert 0 < back["host_write_bytes"] < through["host_write_bytes"]
    assert back["host_hit_tokens"] == through["host_hit_tokens"] == 1024
    # selective copies a node once it is hit twice: no first turn was, none came back
    assert selective["host_write_bytes"] == selective["host_hit_tokens"] == 0
