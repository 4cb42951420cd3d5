"""SGLang's static KV/Mamba split as an engine memory, against the Jenga pool
(bench/studies/long_batch.py).

Tiny hybrid spec (tests/radix_helpers.py): 16 KV bytes per token, one SSM state = 80 bytes.
Budget 1,520 bytes. SGLang's split with ratio 0.9: Mamba budget 1520 * 0.9 / 1.9 = 720 bytes,
so (720 - 80) // 80 = 8 slots (one more is the padding slot); KV tokens (1520 - 9 * 80) // 16 = 50.
The Jenga pool of the same 1,520 bytes (alignment 16): large page = lcm(16, 80) = 80 bytes
(5 KV tokens or 1 state), 19 large pages.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from radix_helpers import hybrid_spec

from jenga_sglang.bench.cli.main import main
from jenga_sglang.bench.drivers.sglang_split import static_split
from jenga_sglang.bench.drivers.split_memory import StaticSplitMemory, split_memory
from jenga_sglang.bench.runs.runner import RunConfig, run
from jenga_sglang.bench.simulation.cost_model import CostModel
from jenga_sglang.bench.simulation.engine import EngineConfig, EngineStats, replay_engine
from jenga_sglang.bench.studies.long_batch import (
    Workload,
    decode_batch_means,
    long_context_batch,
    summarize,
)
from jenga_sglang.bench.traces.packed import PackedRequest, pack
from jenga_sglang.bench.traces.trace import Request
from jenga_sglang.models.presets import get_spec
from jenga_sglang.policies.bundles import build_cache
from jenga_sglang.pool import JengaPool, geometry_for_spec
from jenga_sglang.radix.memory import CacheMemory
from jenga_sglang.radix.pages import OutOfMemory, PageKind, PageType

SPEC = hybrid_spec()
BUDGET = 1520
KV, STATE = PageType(PageKind.KV, 0), PageType(PageKind.STATE, 1)
COST = CostModel(peak_flops=1e15, mfu=1.0, hbm_bytes_per_s=1e30, step_overhead_s=0.001)


def split() -> StaticSplitMemory:
    return split_memory(SPEC, BUDGET)


def pool() -> JengaPool:
    return JengaPool(geometry_for_spec(SPEC, alignment=16), BUDGET)


def strangers(n: int, inp: int, out: int) -> list[PackedRequest]:
    """n requests at t = 0 with disjoint token ids."""
    return pack(
        [
            Request(i, 0, 0.0, list(range(1000 * i, 1000 * i + inp)), [7] * out)
            for i in range(1, n + 1)
        ]
    )


def replay(memory: CacheMemory, requests: list[PackedRequest], reserve: int) -> EngineStats:
    cache, tuner = build_cache("sglang-lru", SPEC, memory)
    config = EngineConfig(decode_reserve_tokens=reserve)
    return replay_engine(requests, cache, tuner, COST, config, check=True)


def batches(stats: EngineStats) -> list[int]:
    return [row[1] for row in stats.timeline]


def test_split_memory_has_sglangs_slot_counts() -> None:
    mem = split()
    s = static_split(SPEC, BUDGET)
    assert (s.kv_tokens, s.mamba_slots) == (50, 8)
    assert (mem.usage(KV).total, mem.usage(STATE).total) == (50, 8)
    assert mem.pool_bytes(PageKind.KV) == 800 and mem.pool_bytes(PageKind.STATE) == 640
    assert mem.wasted_bytes() == 80  # the Mamba pool's padding slot
    assert pool().num_large == 19


def test_free_mamba_slots_do_not_hold_kv() -> None:
    mem = split()
    mem.alloc(KV, 50, owner=1)
    assert mem.usage(STATE).free == 8
    with pytest.raises(OutOfMemory, match="static split"):
        mem.alloc(KV, 1, owner=2)
    assert not mem.fits({KV: 1, STATE: 0})
    assert mem.fits({KV: 0, STATE: 8}) and not mem.fits({STATE: 9})
    assert mem.fits({KV: 50, STATE: 8}, empty=True)
    # The same bytes in a fungible memory would fit: 16 bytes of the 640 idle Mamba bytes.
    assert pool().fits({KV: 51, STATE: 1})
    mem.check_integrity()


def test_kv_short_split_runs_two_where_the_pool_runs_three() -> None:
    """3 requests of 20 + 4 tokens, whole output reserved: 24 tokens + 1 state each.

    Split: 2 x 24 = 48 of 50 KV tokens, so the third waits while 6 Mamba slots sit free; it runs
    after both finish. Steps (decode batch): [prefill r1 r2] 0, decode 2, 2, 2, [prefill r3] 0,
    decode 1, 1, 1. Pool: 3 x (24 x 16 + 80) = 1,392 of 1,520 bytes; in large pages 5 + 1 per
    request = 18 of 19. Steps: 0, 3, 3, 3.
    """
    reqs = strangers(3, 20, 4)
    theirs = replay(split(), reqs, reserve=4)
    ours = replay(pool(), reqs, reserve=4)
    assert batches(theirs) == [0, 2, 2, 2, 0, 1, 1, 1]
    assert batches(ours) == [0, 3, 3, 3]
    assert max(state for _, state in theirs.held_by_kind) <= 2 * 80  # of a 640-byte pool
    assert decode_batch_means(ours)[1] == 3.0 and decode_batch_means(theirs)[1] == 1.5
    for stats in (ours, theirs):
        assert stats.requests == 3 and stats.retractions == 0 and stats.rejected == 0


def test_mamba_short_split_runs_eight_where_the_pool_runs_ten() -> None:
    """10 requests of 2 + 1 tokens: KV needs 30 of 50 tokens, but there are 8 Mamba slots.

    The pool: 10 states take 10 large pages; 30 KV tokens fit in the other 9 (45 tokens).
    """
    reqs = strangers(10, 2, 1)
    theirs = replay(split(), reqs, reserve=1)
    ours = replay(pool(), reqs, reserve=1)
    assert max(batches(theirs)) == 0  # one output token: made by the prefill step
    assert [row[2] for row in theirs.timeline][:2] == [16, 4]  # prefill tokens: 8, then 2 requests
    assert [row[2] for row in ours.timeline] == [20]
    assert theirs.requests == ours.requests == 10


def test_decode_growth_retracts_on_the_short_side_only() -> None:
    """No decode reserve: both 20 + 8-token requests are admitted (40 of 50 KV tokens); at
    step 6 they would need 52 tokens. The newest is retracted and restarts after the first;
    Mamba slots never run short."""
    reqs = strangers(2, 20, 8)
    stats = replay(split(), reqs, reserve=0)
    assert stats.retractions == 1 and stats.requests == 2 and stats.rejected == 0
    assert max(kv for kv, _ in stats.held_by_kind) <= 800


@pytest.mark.parametrize("kind", ["split", "pool"])
def test_random_batches_keep_the_engine_and_memory_consistent(kind: str) -> None:
    rng = random.Random(5)
    reqs = pack(
        [
            Request(i, 0, 0.0, [rng.randrange(100, 140) for _ in range(rng.randint(1, 30))],
                    [3] * rng.randint(1, 12))
            for i in range(25)
        ]
    )  # fmt: skip
    memory = split() if kind == "split" else pool()
    stats = replay(memory, reqs, reserve=0)  # check=True: tree and memory after every step
    assert stats.requests + stats.rejected == 25
    assert stats.output_tokens == sum(len(r.out) for r in reqs if len(r.inp) + len(r.out) <= 50)
    for row in stats.timeline:
        assert sum(row[3:]) == BUDGET
    summary = summarize(stats, memory)
    assert 0 < summary["decode_batch_time_weighted"] <= summary["decode_batch_max"]


def test_long_context_batch_is_seeded_and_in_range() -> None:
    work = Workload(requests=4, min_input=50, max_input=90, min_output=3, max_output=5, seed=2)
    a, b = long_context_batch(work), long_context_batch(work)
    assert a == b and len(a) == 4 and all(r.ts == 0.0 for r in a)
    assert all(50 <= len(r.input_tokens) <= 90 and 3 <= len(r.output_tokens) <= 5 for r in a)
    assert long_context_batch(Workload(4, 50, 90, 3, 5, seed=3)) != a


PURE = ["--memories", "jenga,sglang-split,bytes"]  # sglang-unified: tests/test_unified_memory.py


def test_cli_compares_the_memories_on_one_workload(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["long-batch", "--cache-gb", "1.2", "--requests", "3", "--min-input", "20000"]
    argv += ["--max-input", "30000", "--min-output", "2", "--max-output", "3", "--json", *PURE]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    runs = result["runs"]
    assert list(runs) == ["jenga", "sglang-split", "bytes"]
    assert result["of_unified"] is None
    expected = static_split(get_spec("nemotron-h-8b"), round(1.2e9))
    assert runs["sglang-split"]["kv_pool_bytes"] == expected.kv_bytes
    assert runs["jenga"]["kv_pool_bytes"] == round(1.2e9)
    ours, theirs = (runs[m]["decode_batch_time_weighted"] for m in ("jenga", "sglang-split"))
    assert result["ratio"] == pytest.approx(ours / theirs)
    shared = runs["bytes"]["decode_batch_time_weighted"]
    assert result["of_shared"] == pytest.approx(ours / shared)
    assert shared >= theirs  # one shared budget never runs fewer requests than the split


def test_replay_of_the_written_trace_matches_the_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`replay --mode engine --memory M` on the trace long-batch wrote runs the same engine."""
    trace = str(tmp_path / "batch.jsonl.gz")
    argv = ["long-batch", "--cache-gb", "1.2", "--requests", "3", "--min-input", "20000"]
    argv += ["--max-input", "30000", "--min-output", "2", "--max-output", "9", "--json", *PURE]
    assert main([*argv, "--write-trace", trace]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    for memory in ("jenga", "sglang-split"):
        config = RunConfig(trace, "nemotron-h-8b", 1.2, "sglang-lru", "engine", memory)
        record = run(config)
        assert record["makespan_s"] == pytest.approx(runs[memory]["makespan_s"])
        assert record["ttft_mean_s"] == pytest.approx(runs[memory]["ttft_mean_s"])
        assert record["decode_batch_max"] == runs[memory]["decode_batch_max"]


def test_pure_python_memories_never_import_sglang(tmp_path: Path) -> None:
    """`long-batch` imports sglang (15-27 s) only when sglang-unified is among --memories."""
    argv = ["long-batch", "--cache-gb", "1.2", "--requests", "2", "--min-input", "20000"]
    argv += ["--max-input", "21000", "--min-output", "2", "--max-output", "3", *PURE]
    code = (
        "import sys; from jenga_sglang.bench.cli.main import main; "
        f"assert main({argv!r}) == 0; print(sorted({{'sglang'}} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_unknown_memories_are_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["long-batch", "--memories", "jenga,sglang-static"]) == 2
    assert "sglang-static" in capsys.readouterr().err
