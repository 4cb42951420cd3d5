"""Long-context batch in engine mode: the Jenga pool vs SGLang's two memory modes.

Jenga §7 (Fig. 15) sends 20 requests of 55k-110k input tokens to an engine at once and compares
the decode batch each engine sustains. Here every memory faces the same workload on one model
spec, byte budget, cache policy, cost model and engine configuration, one after the other in one
process, through the one engine loop (bench/simulation/engine.py); only the memory differs:

* `jenga`: JengaPool(geometry_for_spec(spec), budget): one buffer of large pages that go to KV
  or to SSM states as requests need them;
* `sglang-split`: the slots SGLang 0.5.23 carves from the same budget with
  `--mamba-full-memory-ratio 0.9` (bench/drivers/split_memory.py): a request runs only when the
  KV pool holds its tokens *and* the Mamba pool holds its state; otherwise it waits, or the engine
  retracts the newest request;
* `sglang-unified`: SGLang's `--enable-unified-memory` pool of the same budget, driven through
  its real allocators on CPU (bench/drivers/unified_memory.py): KV and states grow from the two
  ends of one buffer, its admission and reserve rules, and its compaction, whose moves are counted;
  it imports sglang (15-27 s), only when selected (`--memories`);
* `bytes`: one shared byte budget with no pages or pools, the best any unified memory can do.

Workload (`long_context_batch`, seeded): `requests` requests at t = 0, input uniform in
[min_input, max_input], output uniform in [min_output, max_output], random token ids (no shared
prefixes). Default outputs 1,000-2,000 tokens: long enough that decode, the phase whose batch is
measured, dominates the run (Jenga's 50-100 output tokens are one flag away).

Reported per memory: average decode batch, time-weighted over decode steps (steps with at least
one decoding request, weighted by their duration) and plain per decode step (Jenga's Fig. 15
average); TTFT; output throughput; makespan; retractions; and a memory timeline of bytes held by
KV pages and by SSM states (for the split: against each pool's own size, which shows the side
that sits idle); for `sglang-unified` also what its compaction moved. The ratio jenga /
sglang-split of the time-weighted decode batch is the figure checked against the target
(>= 1.9x; Jenga reports 1.95x over SGLang); `of_unified` and `of_shared` are jenga's batch over
SGLang's unified pool and over the shared byte budget.

    jenga-bench long-batch [--cache-gb 54,24,18,8] [--memories jenga,sglang-split] [--json]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jenga_sglang.bench.runs.runner import GB, build_memory, memory_fields, percentile
from jenga_sglang.bench.simulation.cost_model import CostModel
from jenga_sglang.bench.simulation.engine import EngineConfig, EngineStats, replay_engine
from jenga_sglang.bench.traces.packed import PackedRequest
from jenga_sglang.bench.traces.synthetic import make_rng, random_tokens, uniform_len
from jenga_sglang.bench.traces.trace import Request
from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.bundles import build_cache
from jenga_sglang.radix.memory import CacheMemory
from jenga_sglang.radix.pages import PageKind

# "bytes" is one shared byte budget with no page or pool structure: what any unified KV/Mamba
# memory (SGLang's --enable-unified-memory included) can at best reach on the same budget.
MEMORIES = ("jenga", "sglang-split", "sglang-unified", "bytes")
TARGET_RATIO = 1.9
VOCAB = 131_072  # Nemotron-H's vocabulary size; ids only need to be distinct across requests
TIMELINE_POINTS = 200


@dataclass(frozen=True)
class Workload:
    requests: int = 20
    min_input: int = 55_000
    max_input: int = 110_000
    min_output: int = 1_000
    max_output: int = 2_000
    seed: int = 0


def long_context_batch(work: Workload) -> list[Request]:
    """`work.requests` single-turn requests, all arriving at t = 0 (session = request)."""
    rng = make_rng(work.seed)
    reqs = []
    for i in range(work.requests):
        n_in = uniform_len(rng, work.min_input, work.max_input)
        n_out = uniform_len(rng, work.min_output, work.max_output)
        reqs.append(
            Request(i, 0, 0.0, random_tokens(rng, n_in, VOCAB), random_tokens(rng, n_out, VOCAB))
        )
    return reqs


def decode_batch_means(stats: EngineStats) -> tuple[float, float]:
    """(time-weighted, per-step) mean decode batch over the steps that decoded something."""
    steps = [
        (row[1], seconds)
        for row, seconds in zip(stats.timeline, stats.step_seconds, strict=True)
        if row[1] > 0
    ]
    if not steps:
        return 0.0, 0.0
    time = sum(s for _, s in steps)
    return sum(b * s for b, s in steps) / time, sum(b for b, _ in steps) / len(steps)


def pool_sizes(memory: CacheMemory) -> tuple[int, int]:
    """Bytes that KV pages / SSM states may occupy at most (the split's pools; else all)."""
    from jenga_sglang.bench.drivers.split_memory import StaticSplitMemory

    if isinstance(memory, StaticSplitMemory):
        return memory.pool_bytes(PageKind.KV), memory.pool_bytes(PageKind.STATE)
    return memory.capacity_bytes, memory.capacity_bytes


def summarize(stats: EngineStats, memory: CacheMemory) -> dict[str, Any]:
    weighted, per_step = decode_batch_means(stats)
    ttfts = sorted(stats.ttfts)
    durations = stats.step_seconds
    total = sum(durations) or 1.0
    kv_pool, state_pool = pool_sizes(memory)
    kv_mean = sum(k * s for (k, _), s in zip(stats.held_by_kind, durations, strict=True)) / total
    st_mean = sum(m * s for (_, m), s in zip(stats.held_by_kind, durations, strict=True)) / total
    every = max(1, math.ceil(len(stats.timeline) / TIMELINE_POINTS))
    rows = list(zip(stats.timeline, stats.held_by_kind, strict=True))[::every]
    return {
        "requests": stats.requests,
        "rejected": stats.rejected,
        "decode_batch_time_weighted": weighted,
        "decode_batch_per_step": per_step,
        "decode_batch_max": max((row[1] for row in stats.timeline), default=0),
        "ttft_mean_s": sum(ttfts) / len(ttfts) if ttfts else 0.0,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_max_s": ttfts[-1] if ttfts else 0.0,
        "makespan_s": stats.makespan_s,
        "throughput_tok_s": stats.output_tokens / stats.makespan_s if stats.makespan_s else 0.0,
        "steps": stats.steps,
        "decode_steps": sum(1 for row in stats.timeline if row[1] > 0),
        "retractions": stats.retractions,
        "kv_pool_bytes": kv_pool,
        "state_pool_bytes": state_pool,
        "kv_held_mean_bytes": kv_mean,
        "state_held_mean_bytes": st_mean,
        "wall_s": stats.wall_s,
        "timeline": {
            "t": [r[0] for r, _ in rows],
            "decode_batch": [r[1] for r, _ in rows],
            "kv_held": [k for _, (k, _) in rows],
            "state_held": [m for _, (_, m) in rows],
            "free": [r[6] for r, _ in rows],
        },
    }


def run_memory(
    kind: str,
    requests: Sequence[PackedRequest],
    spec: ModelSpec,
    budget: int,
    policy: str,
    cost: CostModel,
    config: EngineConfig,
    check: bool = False,
) -> dict[str, Any]:
    memory = build_memory(kind, spec, budget)
    cache, tuner = build_cache(policy, spec, memory)
    stats = replay_engine(requests, cache, tuner, cost, config, check=check)
    return {"memory": kind, **summarize(stats, memory), **memory_fields(memory)}


def compare(
    requests: Sequence[PackedRequest],
    spec: ModelSpec,
    budget: int,
    policy: str,
    cost: CostModel,
    config: EngineConfig,
    check: bool = False,
    memories: Sequence[str] = MEMORIES,
) -> dict[str, Any]:
    """Every memory on one budget. `ratio` = jenga / split time-weighted decode batch (the
    target's figure), `of_unified` = jenga / SGLang's unified pool, `of_shared` = jenga / one
    shared byte budget (1.0: the pool loses nothing to its pages); None where one is not run."""
    runs = {m: run_memory(m, requests, spec, budget, policy, cost, config, check) for m in memories}
    ratio = _ratio(runs, "sglang-split")
    return {
        "cache_gb": budget / GB,
        "cache_bytes": budget,
        "ratio": ratio,
        "of_unified": _ratio(runs, "sglang-unified"),
        "of_shared": _ratio(runs, "bytes"),
        "target_met": ratio is not None and ratio >= TARGET_RATIO,
        "runs": runs,
    }


def _ratio(runs: dict[str, dict[str, Any]], other: str) -> float | None:
    """jenga's time-weighted decode batch over `other`'s (inf when `other` never decoded)."""
    if "jenga" not in runs or other not in runs:
        return None
    theirs = runs[other]["decode_batch_time_weighted"]
    return runs["jenga"]["decode_batch_time_weighted"] / theirs if theirs else math.inf
