"""One run = trace x model x cache size x cache x policy x mode -> one flat, JSON-able record.

This is the single place that turns names into objects (model preset, memory, cache under test,
policy bundle, cost model), so the CLI, the sweep and the demo all agree on what a name means.
The cache under test is ours (`jenga`, simulated or, `via="sglang"`, driven through SGLang) or
SGLang's own (`sglang-native`, `sglang-native-unified`; bench/drivers/sglang_run.py). Cache sizes
are decimal: 1 GB = 10**9 bytes (as Marconi's reference).

Packed traces are kept in a module-level table (`load_packed`): the sweep loads every trace
once in the parent and forks its workers, which then share the packed tokens copy-on-write.
"""

from __future__ import annotations

import math
import multiprocessing as mp
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jenga_sglang.bench.drivers.sglang_run import (
    CACHES,
    HICACHE,
    NATIVE_CACHES,
    OURS,
    run_sglang,
    validate_sglang,
)
from jenga_sglang.bench.runs.tiers import (
    first_token,
    host_fields,
    run_hicache,
    validate_hicache,
    validate_host,
)
from jenga_sglang.bench.simulation.cost_model import CostModel
from jenga_sglang.bench.simulation.engine import EngineConfig, EngineStats, replay_engine
from jenga_sglang.bench.simulation.replay import ReplayStats, replay_sequential
from jenga_sglang.bench.traces import trace_cache
from jenga_sglang.bench.traces.packed import PackedRequest, pack
from jenga_sglang.bench.traces.trace import load_trace
from jenga_sglang.compiled import compiled
from jenga_sglang.models.presets import get_spec, preset_names
from jenga_sglang.models.spec import ModelSpec, int8_checkpoints
from jenga_sglang.policies.bundles import build_cache, byte_budget
from jenga_sglang.policies.host import HostSpec, tier_layers
from jenga_sglang.policies.registry import bundle
from jenga_sglang.radix.memory import ByteBudget, CacheMemory

GB = 10**9
MODES = ("sequential", "engine")
MEMORIES = ("bytes", "jenga", "sglang-split", "sglang-unified")
TIMELINE_POINTS = 400
CDF_POINTS = 101

_TRACES: dict[str, list[PackedRequest]] = {}


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one run; `trace` is a path to a trace file.

    `policy` names a bundle (policies/registry.py) for our cache, and is empty for SGLang's own
    caches (`cache`), which run SGLang's LRU.
    """

    trace: str
    model: str
    cache_gb: float
    policy: str
    mode: str = "sequential"
    memory: str = "bytes"
    check: bool = False
    cost: tuple[tuple[str, str], ...] = ()  # cost model overrides (engine mode)
    engine: EngineConfig = field(default_factory=EngineConfig)
    via: str = ""  # "sglang": our policy as SGLang's cache backend (bench/drivers/sglang_run.py)
    cache: str = OURS  # the cache under test: ours, or SGLang's own (sglang_run.NATIVE_CACHES)
    host_gb: float = 0.0  # a host-memory tier of this size (docs/host-tier.md); 0: none
    host_bw: float = 25.0  # its host <-> device bandwidth, GB/s (PCIe 4; 50 for PCIe 5)
    hicache_write: str = "write_through"  # --cache sglang-native-hicache's write policy
    int8_checkpoints: bool = False  # checkpoints stored as SGLang's int8 (models/spec.py)

    @property
    def cache_bytes(self) -> int:
        return round(self.cache_gb * GB)

    @property
    def host_bytes(self) -> int:
        return round(self.host_gb * GB)


def validate(config: RunConfig) -> None:
    """Raise ValueError naming the bad field (before any trace is loaded)."""
    if config.cache not in CACHES:
        raise ValueError(f"unknown cache {config.cache!r}; known: {', '.join(CACHES)}")
    if config.cache == OURS:
        try:
            bundle(config.policy)
        except ValueError as exc:
            if config.policy in NATIVE_CACHES:  # the spelling before --cache
                raise ValueError(f"{exc} (SGLang's own cache: --cache {config.policy})") from None
            raise
    if config.via or config.cache != OURS:  # through SGLang (bench/drivers/sglang_run.py)
        validate_sglang(config.cache, config.policy, config.mode, config.memory, config.via)
    if config.model not in preset_names():
        raise ValueError(f"unknown model {config.model!r}; known: {', '.join(preset_names())}")
    if config.mode not in MODES:
        raise ValueError(f"unknown mode {config.mode!r}; known: {', '.join(MODES)}")
    if config.memory not in MEMORIES:
        raise ValueError(f"unknown memory {config.memory!r}; known: {', '.join(MEMORIES)}")
    if not (math.isfinite(config.cache_gb) and config.cache_gb > 0):
        raise ValueError(f"cache size must be a positive number of GB, got {config.cache_gb}")
    locks = config.cache != OURS or bundle(config.policy).lock_prefix
    validate_host(config.host_gb, config.host_bw, config.cache, config.mode, config.via, locks)
    validate_hicache(config.cache, config.host_gb, config.hicache_write)
    if config.int8_checkpoints:
        _validate_int8(config)
    CostModel.with_overrides(dict(config.cost))


def _validate_int8(config: RunConfig) -> None:
    """Where int8 checkpoints are modelled faithfully: our cache's sequential replay on a byte
    budget or the Jenga pool, which hold the tree's checkpoints and nothing else. SGLang keeps
    running requests' states at full precision beside its int8 checkpoint pool; the engine
    replay and SGLang's pools would quantize those too."""
    if config.cache != OURS or config.via or config.mode != "sequential":
        raise ValueError("--int8-checkpoints runs in the sequential replay of --cache jenga only")
    if config.memory not in ("bytes", "jenga"):
        raise ValueError(
            f"--int8-checkpoints applies to --memory bytes or jenga, not {config.memory}"
        )
    int8_checkpoints(get_spec(config.model))  # raises for a spec it does not apply to


def load_packed(path: str) -> list[PackedRequest]:
    """The packed requests of a trace file, loaded and validated once per process."""
    key = str(Path(path).resolve())
    if key not in _TRACES:
        _TRACES[key] = _load_fresh(path)
    return _TRACES[key]


def preload(paths: Sequence[str], jobs: int) -> None:
    """Load and pack several traces into this process's table, `jobs` at a time.

    Parsing is most of a sweep's serial start-up (~3 s per ShareGPT trace), so a fork pool
    parses the traces side by side and sends the packed requests back. Traces an earlier load
    cached (bench/traces/trace_cache.py) are read here instead: the six ShareGPT traces of the grid
    take 0.5 s of CPU that way, 2.1 s through the pool (which pickles them back).
    """
    todo = [p for p in dict.fromkeys(paths) if str(Path(p).resolve()) not in _TRACES]
    todo = [p for p in todo if not _load_cached(p)]
    jobs = max(1, min(jobs, len(todo)))
    if jobs == 1:
        for path in todo:
            load_packed(path)
        return
    with mp.get_context("fork").Pool(jobs) as pool:
        for path, packed in zip(todo, pool.imap(_load_fresh, todo), strict=True):
            _TRACES[str(Path(path).resolve())] = packed


def _load_cached(path: str) -> bool:
    """Put the trace in the table if the trace cache holds it; whether it did."""
    trace = Path(path)
    cached = trace_cache.load(trace) if trace.is_file() else None
    if cached is not None:
        _TRACES[str(trace.resolve())] = cached
    return cached is not None


def _load_fresh(path: str) -> list[PackedRequest]:
    """Parse, validate and pack a trace, or read what an earlier load packed (trace_cache)."""
    trace = Path(path)
    if not trace.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    cached = trace_cache.load(trace)
    if cached is not None:
        return cached
    packed = pack(load_trace(path))
    trace_cache.store(trace, packed)
    return packed


def build_memory(kind: str, spec: ModelSpec, cache_bytes: int) -> CacheMemory:
    if kind == "bytes":
        return byte_budget(spec, cache_bytes)
    if kind == "jenga":
        from jenga_sglang.pool import JengaPool, geometry_for_spec

        return JengaPool(geometry_for_spec(spec), cache_bytes)
    if kind == "sglang-split":
        from jenga_sglang.bench.drivers.split_memory import split_memory

        return split_memory(spec, cache_bytes)
    if kind == "sglang-unified":  # imports sglang (15-27 s): only when asked for
        from jenga_sglang.bench.drivers.unified_memory import unified_memory

        return unified_memory(spec, cache_bytes)
    raise ValueError(f"unknown memory {kind!r}; known: {', '.join(MEMORIES)}")


def run(config: RunConfig) -> dict[str, Any]:
    """Replay one configuration and return its record (config fields + replay fields)."""
    validate(config)
    requests = load_packed(config.trace)
    spec = get_spec(config.model)
    if config.int8_checkpoints:
        spec = int8_checkpoints(spec)
    if config.cache == HICACHE:  # SGLang's host tier (bench/runs/tiers.py)
        cost = CostModel.with_overrides(dict(config.cost))
        chunk = config.engine.chunk_tokens
        hicache = run_hicache(
            requests,
            spec,
            cost,
            config.cache_bytes,
            config.host_bytes,
            chunk,
            config.host_bw,
            config.hicache_write,
        )
        ttfts = first_token_fields(hicache.pop("ttfts"))
        return {**_config_fields(config), **hicache, **ttfts}
    if config.via or config.cache != OURS:
        policy = bundle(config.policy) if config.cache == OURS else None
        through = run_sglang(
            config.cache, policy, requests, spec, config.cache_bytes, config.engine.chunk_tokens
        )
        return {**_config_fields(config), **through}
    memory = build_memory(config.memory, spec, config.cache_bytes)
    cost = CostModel.with_overrides(dict(config.cost))
    host = None
    if config.host_gb > 0:
        sizes = {t: memory.page_bytes(t) for t in memory.page_types}  # one host pool
        host = HostSpec(
            ByteBudget(config.host_bytes, sizes), config.host_bw * GB, cost.peak_flops * cost.mfu
        )
    cache, tuner = build_cache(config.policy, spec, memory, host)
    stats: ReplayStats
    if config.mode == "sequential":
        ttft = first_token(cost, cache.cost.flops, tier_layers(spec), config.host_bw * GB)
        stats = replay_sequential(requests, cache, tuner, check=config.check, ttft=ttft)
    else:
        stats = replay_engine(requests, cache, tuner, cost, config.engine, check=config.check)
    record: dict[str, Any] = {
        **_config_fields(config),
        **stats.fields(),
        "peak_bytes": int(getattr(memory, "peak_bytes", _peak_from(stats, memory))),
        "capacity_violations": int(getattr(memory, "capacity_violations", 0)),
        "alpha": float(cache.eviction.alpha),
        "tunings": tuner.log.tunings if tuner is not None else 0,
        "evicted_nodes": cache.evicted_nodes,
        "evicted_states": cache.evicted_states,
        "compiled": compiled(),  # the optional mypyc build (jenga_sglang/compiled.py) ran it
    }
    if isinstance(stats, EngineStats):
        record.update(engine_fields(stats))
    else:
        record.update(first_token_fields(stats.ttfts))
    record.update(memory_fields(memory))
    if cache.host is not None:
        record.update(host_fields(cache.host))
    return record


def first_token_fields(ttfts: list[float]) -> dict[str, float]:
    """Mean and percentiles of a sequential replay's estimated times to first token."""
    ordered = sorted(ttfts)
    return {
        "ttft_est_mean_s": sum(ordered) / len(ordered) if ordered else 0.0,
        "ttft_est_p50_s": percentile(ordered, 50),
        "ttft_est_p95_s": percentile(ordered, 95),
        "ttft_est_p99_s": percentile(ordered, 99),
    }


def memory_fields(memory: CacheMemory) -> dict[str, int]:
    """What the memory itself reports beyond the contract: SGLang's unified pool, what its
    compaction moved (`moves()`); nothing for the others."""
    moves = getattr(memory, "moves", None)
    return dict(moves()) if callable(moves) else {}


def _config_fields(config: RunConfig) -> dict[str, Any]:
    return {
        "trace": config.trace,
        "model": config.model,
        "mode": config.mode,
        "memory": config.memory,
        # SGLang's own caches were named by `--policy` before `--cache`: their records keep that
        "policy": config.policy if config.cache == OURS else config.cache,
        "cache": config.cache,
        "cache_gb": config.cache_gb,
        "cache_bytes": config.cache_bytes,
        "host_gb": config.host_gb,
        "host_bw": config.host_bw,
        # only where on, so that records of full-precision runs are as before
        **({"int8_checkpoints": True} if config.int8_checkpoints else {}),
    }


def _peak_from(stats: ReplayStats, memory: CacheMemory) -> int:
    """Peak held bytes for memories that do not track it (sampled per engine step)."""
    if isinstance(stats, EngineStats) and stats.timeline:
        return max(row[3] + row[4] for row in stats.timeline)
    return memory.held_bytes()


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of an ascending list; 0.0 when empty."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def engine_fields(stats: EngineStats) -> dict[str, Any]:
    """Latency, throughput, batch and memory figures of an engine replay."""
    ttfts = sorted(stats.ttfts)
    batches = [row[1] for row in stats.timeline]
    step = max(1, math.ceil(len(stats.timeline) / TIMELINE_POINTS))
    rows = stats.timeline[::step]
    names = ("t", "decode_batch", "prefill_tokens", "used", "evictable", "wasted", "free")
    return {
        "ttft_mean_s": sum(ttfts) / len(ttfts) if ttfts else 0.0,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "ttft_p99_s": percentile(ttfts, 99),
        "ttft_cdf_s": [percentile(ttfts, q) for q in range(CDF_POINTS)],
        "makespan_s": stats.makespan_s,
        "throughput_tok_s": stats.output_tokens / stats.makespan_s if stats.makespan_s else 0.0,
        "steps": stats.steps,
        "retractions": stats.retractions,
        "rejected": stats.rejected,
        "decode_batch_mean": sum(batches) / len(batches) if batches else 0.0,
        "decode_batch_max": max(batches, default=0),
        "timeline": {name: [row[i] for row in rows] for i, name in enumerate(names)},
    }
