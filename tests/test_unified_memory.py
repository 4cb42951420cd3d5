"""SGLang's --enable-unified-memory pool as an engine memory (bench/drivers/unified_memory.py),
on SGLang 0.5.23's real allocators on CPU.

marconi-7b: 65,536 KV bytes per token, one state = 26,787,840 bytes (408.75 tokens of KV). At
0.5 GB SGLang's static split has 7 Mamba slots, so the unified buffer holds 0.5 GB less the
4 KiB rounding of its token side; KV grows down from the top, states up from above the one-state
slot-0 sink.
"""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path
from typing import Any

import pytest

from jenga_sglang.bench.cli.main import main
from jenga_sglang.bench.runs.runner import RunConfig, run
from jenga_sglang.bench.simulation.cost_model import CostModel
from jenga_sglang.bench.simulation.engine import EngineConfig, replay_engine
from jenga_sglang.bench.studies.long_batch import MEMORIES
from jenga_sglang.bench.traces.packed import pack
from jenga_sglang.bench.traces.trace import Request
from jenga_sglang.models.presets import get_spec
from jenga_sglang.policies.bundles import build_cache
from jenga_sglang.radix.pages import IdPages, OutOfMemory, Pages, PageType

SPEC = get_spec("marconi-7b")
BUDGET = 5 * 10**8
COST = CostModel(peak_flops=1e15, mfu=1.0, hbm_bytes_per_s=1e12, step_overhead_s=0.001)


def memory(lazy: bool = True, budget: int = BUDGET, spec_name: str = "marconi-7b") -> Any:
    from jenga_sglang.bench.drivers.unified_memory import unified_memory

    return unified_memory(get_spec(spec_name), budget, lazy_compaction=lazy)


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def conserved(mem: Any) -> None:
    mem.check_integrity()
    for ptype in mem.page_types:
        u = mem.usage(ptype)
        assert u.free + u.evictable + u.used == u.total, (ptype, u)


@pytest.mark.sglang
def test_a_54_gb_pool_is_built_without_paging_its_buffer_in() -> None:
    memory()  # imports and first-use costs out of the measurement
    before = rss_bytes()
    mem = memory(budget=54 * 10**9, spec_name="nemotron-h-8b")
    # SGLang's own torch.empty + zero_() would page in 54 GB (or fail to allocate it); what
    # remains resident is its id tables: 3.3 M KV pages x (v2p, p2v, free ids) x 8 bytes.
    assert rss_bytes() - before < 200 * 2**20
    assert 54 * 10**9 - 4096 < mem.capacity_bytes <= 54 * 10**9  # token side floored to 4 KiB
    # All KV tokens the buffer holds but the slot-0 sink's (one state: 6,234 tokens of KV).
    sink = mem.page_bytes(mem.state_type) // 16384
    assert mem.room(mem.kv_type) == mem.capacity_bytes // 16384 - sink
    assert mem.moves()["moved_bytes"] == 0


@pytest.mark.sglang
@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
def test_allocations_fail_exactly_when_sglangs_allocator_does(lazy: bool) -> None:
    """The same random alloc / free sequence on our memory and directly on a twin SGLang
    allocator: the same successes, failures and ids, and the counters conserved throughout."""
    from jenga_sglang.bench.drivers import sglang_pools
    from jenga_sglang.bench.drivers.sglang_split import static_split

    mem = memory(lazy)
    twin = sglang_pools.unified_pools(SPEC, static_split(SPEC, BUDGET), 1, False, lazy)
    twin_slots = twin.req_to_token_pool.mamba_allocator
    kv, st = mem.kv_type, mem.state_type
    rng = random.Random(7)
    held: list[tuple[PageType, Pages]] = []
    outcomes = {True: 0, False: 0}
    for _ in range(300):
        if held and rng.random() < 0.4:
            ptype, pages = held.pop(rng.randrange(len(held)))
            mem.free(ptype, pages)
            index = _tensor(pages.ids())
            twin.allocator.free(index) if ptype == kv else twin_slots.free(index)
        else:
            ptype = kv if rng.random() < 0.7 else st
            count = rng.randint(1, 2500) if ptype == kv else rng.randint(1, 3)
            theirs = _twin_alloc(twin, ptype == kv, count)
            try:
                pages = mem.alloc(ptype, count, owner=0)
            except OutOfMemory:
                assert theirs is None, f"{ptype} x {count}: SGLang allocated, we refused"
                outcomes[False] += 1
            else:
                assert theirs is not None and theirs.tolist() == pages.ids()
                held.append((ptype, pages))
                outcomes[True] += 1
        conserved(mem)
    assert outcomes[True] > 50 and outcomes[False] > 50  # both sides of the boundary seen


def _tensor(ids: list[int]) -> Any:
    import torch

    return torch.tensor(ids, dtype=torch.int64)


def _twin_alloc(twin: Any, is_kv: bool, count: int) -> Any:
    if is_kv:
        return twin.allocator.alloc(count)
    twin.allocator.prepare_mamba_allocation(count)
    return twin.req_to_token_pool.mamba_allocator.alloc(count)


@pytest.mark.sglang
def test_lazy_compaction_moves_kv_only_when_states_need_its_holes() -> None:
    mem = memory(lazy=True)
    kv, st = mem.kv_type, mem.state_type
    kv_bytes, state_bytes = mem.page_bytes(kv), mem.page_bytes(st)
    first = mem.alloc(kv, 1000, owner=0)  # the top of the buffer
    mem.alloc(kv, 2000, owner=0)  # right below it
    states = mem.alloc(st, 3, owner=0)
    mem.free(kv, first)
    mem.free(st, IdPages(states.ids()[:1]))
    # Frees only leave holes: the KV room grows by the hole (its own side reuses it) and by the
    # freed state's 408 tokens of bytes; nothing moved yet.
    assert mem.moves() == {k: 0 for k in mem.moves()}
    assert mem.room(st) == (mem.free_bytes() - state_bytes) // state_bytes + 1  # + its hole
    # Taking every state the bytes allow needs the KV hole: SGLang packs the 1000 lowest KV
    # pages of the second request into it, and then reuses the state hole without moving.
    mem.alloc(st, mem.room(st), owner=0)
    assert mem.moves()["moved_kv_pages"] == 1000
    assert mem.moves()["moved_state_pages"] == 0
    assert mem.moves()["moved_bytes"] == 1000 * kv_bytes
    assert mem._full._stats_n_flush_moves == 1000  # SGLang's own counter agrees
    conserved(mem)


@pytest.mark.sglang
def test_eager_compaction_moves_at_every_free() -> None:
    mem = memory(lazy=False)
    kv, st = mem.kv_type, mem.state_type
    first = mem.alloc(kv, 1000, owner=0)
    mem.alloc(kv, 2000, owner=0)
    mem.free(kv, first)  # the 1000 lowest live KV pages move into the freed top at once
    assert mem.moves()["moved_kv_pages"] == 1000
    states = mem.alloc(st, 3, owner=0)
    mem.free(st, IdPages(states.ids()[:1]))  # the topmost state moves into the hole
    moves = mem.moves()
    assert moves["moved_state_pages"] == 1
    assert moves["moved_bytes"] == 1000 * mem.page_bytes(kv) + mem.page_bytes(st)
    assert moves["move_copies"] == 2
    conserved(mem)


def _workload() -> list[Any]:
    """10 requests at t = 0 on 0.5 GB: shared prefixes (hits, locks) and too little room for
    all (evictions, retractions)."""
    rng = random.Random(3)
    common = list(range(10**6, 10**6 + 800))
    reqs = []
    for i in range(10):
        own = list(range(10_000 * (i + 1), 10_000 * (i + 1) + rng.randint(200, 1800)))
        reqs.append(
            Request(i, 0, 0.0, (common if i % 2 else []) + own, [7] * rng.randint(200, 800))
        )
    return pack(reqs)


@pytest.mark.sglang
@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
def test_engine_conserves_pages_through_evictions_and_retractions(lazy: bool) -> None:
    mem = memory(lazy)
    cache, tuner = build_cache("sglang-lru", SPEC, mem)
    config = EngineConfig(chunk_tokens=512, decode_reserve_tokens=8)  # retracts
    stats = replay_engine(_workload(), cache, tuner, COST, config, check=True)
    assert stats.requests == 10 and stats.rejected == 0
    assert stats.retractions > 0 and cache.tree.evicted_nodes > 0 and stats.hit_tokens > 0
    assert mem.moves()["moved_bytes"] > 0
    conserved(mem)


@pytest.mark.sglang
def test_a_pickled_copy_is_detached_from_sglang() -> None:
    from jenga_sglang.binding.slots.memory import SlotMemory

    mem = memory()
    kv, st = mem.kv_type, mem.state_type
    pages, state = mem.alloc(kv, 300, owner=0), mem.alloc(st, 1, owner=0)
    mem.mark_evictable(kv, pages)
    copy = pickle.loads(pickle.dumps(mem))
    assert isinstance(copy, SlotMemory)
    assert (copy.usage(kv).evictable, copy.usage(st).used) == (300, 1)
    room = mem.room(kv)
    copy.free_evictable(kv, pages)
    copy.free(st, state)
    assert mem.room(kv) == room  # SGLang's allocator never heard of the copy's frees
    conserved(mem)


LONG_BATCH = ["long-batch", "--cache-gb", "1.2", "--requests", "3", "--min-input", "20000"]
LONG_BATCH += ["--max-input", "30000", "--min-output", "2", "--max-output", "9", "--json"]


@pytest.mark.sglang
def test_long_batch_runs_the_four_memories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = str(tmp_path / "batch.jsonl.gz")
    assert main([*LONG_BATCH, "--check", "--write-trace", trace]) == 0
    result = json.loads(capsys.readouterr().out)
    runs = result["runs"]
    assert list(runs) == list(MEMORIES)
    ours, theirs = (runs[m]["decode_batch_time_weighted"] for m in ("jenga", "sglang-unified"))
    assert result["of_unified"] == pytest.approx(ours / theirs)
    assert runs["sglang-unified"]["moved_bytes"] >= 0
    assert all("moved_bytes" not in runs[m] for m in MEMORIES if m != "sglang-unified")
    # The same memory through `replay --mode engine` on the written trace: the same run.
    record = run(RunConfig(trace, "nemotron-h-8b", 1.2, "sglang-lru", "engine", "sglang-unified"))
    assert record["makespan_s"] == pytest.approx(runs["sglang-unified"]["makespan_s"])
    assert record["moved_bytes"] == runs["sglang-unified"]["moved_bytes"]
