"""Prefill-decode disaggregation served live on CPU (bench/studies/pd_cpu.py), the KV and Mamba
state moved between the two processes by the TCP stand-in for Mooncake's engine
(jenga_sglang/cpu_transfer.py): `jenga`, the Jenga pool on both sides (its page regions are
what the engine moves, binding/pools/transfer.py), and `jenga-no-pool`, our tree on the prefill
side over SGLang's pools with a stock decode side. Over the pool, four requests are aborted
first (both sides, either side alone; in the bootstrap, the transfer and decode). And the pool
with the decode side's own radix cache, whose hits need the KV alone. `make pd-cpu` runs the
study, stock beside it."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest

from jenga_sglang.bench.studies import pd_cpu

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


ARGS = Namespace(sessions=1, turns=2, forks=2, reply_tokens=6, seed=0, aborts=0, server_flags="")


@pytest.fixture(scope="module")
def expected(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> list[list[int]]:
    """One stock server's greedy replies to the load (no PD)."""
    return pd_cpu.reference(str(tiny_model), ARGS, tmp_path_factory.mktemp("reference"))


@pytest.mark.parametrize("variant", ["jenga", "jenga-no-pool"])
def test_a_session_served_disaggregated_replies_as_one_server_and_hits_on_prefill(
    tiny_model: Path, tmp_path: Path, expected: list[list[int]], variant: str
) -> None:
    """Every greedy reply equals one stock server's (so the bytes that moved were the
    prefill's KV and state), the second turn hits the first on the prefill side, and the
    second fork hits the branch point our tree kept (stock's keeps none)."""
    aborts = 4 if variant == "jenga" else 0
    args = Namespace(**{**vars(ARGS), "aborts": aborts})
    result = pd_cpu.run_variant(str(tiny_model), variant, args, tmp_path)
    assert len(result["aborted"]) == aborts
    assert result["alive_after"] and result["leak_reports"] == 0, result["aborted"]
    assert result["replies"] == expected
    assert result["kinds"] == ["turn", "turn", "fork", "fork"]
    first, second, _, fork = result["prefill_cached_per_request"]
    assert first == 0 and second > 0 and fork >= pd_cpu.FORK_AT, result
    # the prefill side's count reaches decode in the metadata the engine moved with the KV
    assert result["decode_cached_per_request"] == result["prefill_cached_per_request"]
    assert result["prefill_rounds"] == result["requests"]  # no extra round for the hits
    assert result["tracebacks"] == 0


def test_the_decode_sides_own_tree_hits_on_kv_alone(
    tiny_model: Path, tmp_path: Path, expected: list[list[int]]
) -> None:
    """`--disaggregation-decode-enable-radix-cache` on a jenga decode worker: the replies stay
    one stock server's though the prefill side sends only the KV past the decode side's hit
    (with the whole state), the second turn hits the first turn's prompt and reply there, and
    the first fork, which the prefill side misses, hits its shared prefix on the decode side,
    where no state lies (the decode tree keeps none)."""
    result = pd_cpu.run_variant(str(tiny_model), "jenga-decode-tree", ARGS, tmp_path)
    assert result["replies"] == expected
    assert result["alive_after"] and result["leak_reports"] == 0 and result["tracebacks"] == 0
    prefill = result["prefill_cached_per_request"]
    decode = result["decode_cached_per_request"]
    assert prefill[0] == decode[0] == 0 and prefill[2] == 0, result
    assert decode[1] == ARGS.reply_tokens - 1 + prefill[1] > prefill[1], result
    assert decode[2] >= pd_cpu.FORK_AT and decode[3] >= pd_cpu.FORK_AT, result
    assert result["prefill_rounds"] == result["requests"]
