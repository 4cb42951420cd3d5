"""Internal fragmentation of the Jenga pool on a Jenga-style long-request workload.

Workload: `--requests` long requests (lengths uniform in [min, max] tokens, seeded) arrive
together; each takes one SSM state page, then KV pages are allocated one token at a time,
round-robin across the requests still prefilling (as a batched prefill/decode interleaves them).
Measured at two moments: at the peak (every token allocated) and after half of the requests (a
seeded random half) finished and freed all their pages.

Internal fragmentation = bytes of empty small pages inside carved large pages (usable only by
their own type, and for the naive allocator stranded among other requests' pages), divided by the
pool's total bytes. The request-aware allocator (Jenga §4.3) is compared with a naive one that
fills any open large page of the type first.

Two capacities: "tight" = the workload's demand rounded up to whole large pages (a memory-bound
server, as in Jenga's evaluation: the slack is under one large page), and "roomy" = 1.5x the
demand (free large pages left over, so every request keeps its own partially filled large page).
`frag LP` expresses fragmentation in large pages: request-aware allocation strands at most one
partially filled large page per live request and type.

    python -m jenga_sglang.bench.fragmentation [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import asdict, dataclass

from jenga_sglang.models.spec import AttentionGroup, DType, MambaGroup, MlpGroup, ModelSpec
from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.pool.sizing import PoolGeometry, geometry_for_spec
from jenga_sglang.radix.memory import IdPages, PageKind, PageType


def nemotron_h_like() -> ModelSpec:
    """NemotronH-8B's cache shapes, by hand (used when the preset is unavailable)."""
    return ModelSpec(
        "nemotron-h-8b-like",
        (
            AttentionGroup("attention", 4, 8, 128, DType.BF16, 8.4e7, 16384.0),
            MambaGroup("mamba", 24, (10240, 3), DType.BF16, (128, 64, 128), DType.FP32, 2.3e8),
            MlpGroup("mlp", 24, 3.5e8),
        ),
        hidden_size=4096,
        source="hand-built NemotronH-8B shapes",
    )


def load_spec(name: str) -> ModelSpec:
    try:
        from jenga_sglang.models.presets import get_spec

        return get_spec(name)
    except (ImportError, KeyError, ValueError):
        return nemotron_h_like()


@dataclass(frozen=True)
class Measure:
    scenario: str
    allocator: str
    moment: str
    capacity_bytes: int
    held_bytes: int
    fragmentation_bytes: int
    fragmentation_percent: float  # of the pool's total bytes
    carved_percent: float  # fragmentation as a share of bytes in carved large pages
    free_large_pages: int


def _measure(pool: JengaPool, scenario: str, allocator: str, moment: str) -> Measure:
    frag = pool.fragmentation_bytes()
    carved = (pool.num_large - pool.free_large_pages) * pool.geometry.large_page_bytes
    return Measure(
        scenario=scenario,
        allocator=allocator,
        moment=moment,
        capacity_bytes=pool.capacity_bytes,
        held_bytes=pool.held_bytes(),
        fragmentation_bytes=frag,
        fragmentation_percent=100.0 * frag / pool.capacity_bytes,
        carved_percent=100.0 * frag / carved if carved else 0.0,
        free_large_pages=pool.free_large_pages,
    )


def _types(geo: PoolGeometry) -> tuple[PageType, PageType | None]:
    kv = [t for t in geo.page_types if t.kind is PageKind.KV]
    state = [t for t in geo.page_types if t.kind is PageKind.STATE]
    if len(kv) != 1:
        raise ValueError(f"the benchmark expects one attention group, got {len(kv)}")
    return kv[0], (state[0] if state else None)


def run_scenario(
    geo: PoolGeometry, lengths: list[int], capacity: int, *, request_aware: bool, seed: int
) -> list[Measure]:
    """Allocate the workload into a fresh pool; measure at the peak and after half finished."""
    kv, state = _types(geo)
    tpp = geo.tokens_per_page
    name = "request-aware" if request_aware else "naive"
    pool = JengaPool(geo, capacity, request_aware=request_aware)
    held: dict[int, dict[PageType, list[int]]] = {r: {kv: []} for r in range(len(lengths))}
    if state is not None:
        for r in held:
            held[r][state] = pool.alloc(state, 1, r).ids()
    for step in range(0, max(lengths), tpp):  # a new KV page every tokens_per_page tokens
        for r, length in enumerate(lengths):
            if step < length:
                held[r][kv] += pool.alloc(kv, 1, r).ids()
    peak = _measure(pool, "", name, "peak")
    finished = random.Random(seed + 1).sample(range(len(lengths)), len(lengths) // 2)
    for r in finished:
        for ptype, ids in held.pop(r).items():
            pool.free(ptype, IdPages(ids))
    after = _measure(pool, "", name, "half finished")
    pool.check_integrity()
    return [peak, after]


def demand_bytes(geo: PoolGeometry, lengths: list[int]) -> int:
    kv, state = _types(geo)
    per_state = geo.of(state).page_bytes if state is not None else 0
    pages = sum(-(-n // geo.tokens_per_page) for n in lengths)
    return pages * geo.of(kv).page_bytes + len(lengths) * per_state


def run(args: argparse.Namespace) -> dict[str, object]:
    spec = load_spec(args.spec)
    geo = geometry_for_spec(spec, tokens_per_page=args.tokens_per_page)
    rng = random.Random(args.seed)
    lengths = [rng.randint(args.min_tokens, args.max_tokens) for _ in range(args.requests)]
    large = geo.large_page_bytes
    demand = demand_bytes(geo, lengths)
    capacities = {
        "tight": -(-demand // large) * large,
        "roomy": int(1.5 * demand),
    }
    rows: list[Measure] = []
    for scenario, capacity in capacities.items():
        for request_aware in (True, False):
            measures = run_scenario(
                geo, lengths, capacity, request_aware=request_aware, seed=args.seed
            )
            rows += [Measure(**{**asdict(m), "scenario": scenario}) for m in measures]
    return {
        "spec": spec.name,
        "large_page_bytes": large,
        "page_bytes": {str(t.ptype): t.page_bytes for t in geo.types},
        "pages_per_large": {str(t.ptype): t.per_large for t in geo.types},
        "requests": len(lengths),
        "total_tokens": sum(lengths),
        "demand_bytes": demand,
        "seed": args.seed,
        "results": [asdict(r) for r in rows],
    }


def _table(report: dict[str, object]) -> str:
    demand = report["demand_bytes"]
    assert isinstance(demand, int)
    large = report["large_page_bytes"]
    assert isinstance(large, int)
    lines = [
        f"spec {report['spec']}: L = {report['large_page_bytes']} bytes, pages per large page "
        f"{report['pages_per_large']}; {report['requests']} requests, "
        f"{report['total_tokens']} tokens, demand {demand / 2**30:.2f} GiB",
        f"{'capacity':<8} {'allocator':<14} {'moment':<14} {'pool GiB':>9} {'frag MiB':>10} "
        f"{'frag % pool':>11} {'% carved':>9} {'frag LP':>8} {'free LP':>8}",
    ]
    results = report["results"]
    assert isinstance(results, list)
    for r in results:
        lines.append(
            f"{r['scenario']:<8} {r['allocator']:<14} {r['moment']:<14} "
            f"{r['capacity_bytes'] / 2**30:>9.2f} {r['fragmentation_bytes'] / 2**20:>10.1f} "
            f"{r['fragmentation_percent']:>11.3f} {r['carved_percent']:>9.3f} "
            f"{r['fragmentation_bytes'] / large:>8.2f} {r['free_large_pages']:>8}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--spec", default="nemotron-h-8b")
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--min-tokens", type=int, default=55_000)
    p.add_argument("--max-tokens", type=int, default=110_000)
    p.add_argument("--tokens-per-page", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if not 0 < args.min_tokens <= args.max_tokens or args.requests <= 0:
        p.error("need 0 < --min-tokens <= --max-tokens and --requests > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(json.dumps(report) if args.json else _table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
