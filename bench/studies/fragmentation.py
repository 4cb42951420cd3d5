"""Internal fragmentation of the Jenga pool over an engine-like timeline (Jenga §7, Fig. 16).

Workload: `--requests` long requests (prompts uniform in [--min-tokens, --max-tokens], seeded)
arrive together on the `--spec` model's real page types (geometry_for_spec); each decodes
`--decode-tokens` tokens. The engine (bench/simulation/engine.py, under the study's config and
observed by bench/studies/frag_timeline.py) admits FIFO while memory allows, prefills in interleaved
`--chunk-tokens` chunks, decodes in lock step, preempts the newest request when an allocation
fails and frees everything a request held when it finishes. One token per KV page.

Pools of 60%, 100% and 150% of the workload's demand (every request's prompt and decode tokens
plus one state page each), each with the request-aware allocator (Jenga §4.3) and the naive one.
Per run, sampled every step and reported as time average and maximum, in % of the capacity:

* unusable: bytes no allocation of a page type in demand could get (padding, the remainder
  below one large page, empty pages of types nobody will allocate); `@fail` is the maximum over
  failed allocations of the free bytes that the failing type could not use;
* reserved-but-empty: empty small pages inside carved large pages plus partially filled last
  pages (Jenga's definition of waste) plus padding: an upper bound on the first without the
  remainder (column `alloc%`, the allocator's own share of the unusable bytes).

Also per run: steps, preemptions, average decode batch, failed allocations (`fails`), those that
failed although the free bytes inside large pages would have covered them (`frag`).

`--engine-rules replay` runs the same workload under the engine replays' rules (one shared
prefill budget per step, a pushed-out request restarts, 256 decode tokens reserved, admission
on the memory's `fits`; bench/simulation/engine_config.py), so the figures compare with theirs.

    python -m jenga_sglang.bench.studies.fragmentation [--engine-rules study|replay] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from jenga_sglang.bench.studies.frag_timeline import (
    RULES,
    Series,
    Timeline,
    TimelineStats,
    Workload,
)
from jenga_sglang.models.presets import get_spec
from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.pool.sizing import PoolGeometry, geometry_for_spec
from jenga_sglang.radix.pages import PageKind

CAPACITIES = (("60%", 0.6), ("100%", 1.0), ("150%", 1.5))
ALLOCATORS = (("request-aware", True), ("naive", False))


def demand_bytes(geo: PoolGeometry, work: Workload) -> int:
    """Bytes to hold every request at once at its longest (prompt + decode tokens)."""
    tpp = geo.tokens_per_page
    kv = sum(t.page_bytes for t in geo.types if t.ptype.kind is PageKind.KV)
    state = sum(t.page_bytes for t in geo.types if t.ptype.kind is PageKind.STATE)
    pages = sum(-(-(n + work.decode_tokens) // tpp) for n in work.prompts)
    return pages * kv + len(work.prompts) * state


@dataclass(frozen=True)
class Run:
    capacity: str
    allocator: str
    stats: TimelineStats
    capacity_bytes: int
    remainder_bytes: int

    def pct(self, value: float) -> float:
        return 100.0 * value / self.capacity_bytes

    def series(self, s: Series) -> dict[str, float]:
        return {
            "avg_bytes": s.mean,
            "max_bytes": s.peak,
            "avg_percent": self.pct(s.mean),
            "max_percent": self.pct(s.peak),
        }

    def to_json(self) -> dict[str, object]:
        s = self.stats
        failures = {
            t: {
                "count": f.count,
                "fragmentation_caused": f.fragmentation_caused,
                "unusable": self.series(f.unusable),
            }
            for t, f in sorted(s.failures.items())
        }
        return {
            "capacity": self.capacity,
            "allocator": self.allocator,
            "capacity_bytes": self.capacity_bytes,
            "remainder_bytes": self.remainder_bytes,
            "steps": s.steps,
            "admissions": s.admissions,
            "preemptions": s.preemptions,
            "finished": s.finished,
            "avg_decode_batch": s.decode_tokens / s.decode_steps if s.decode_steps else 0.0,
            "held": self.series(s.held),
            "unusable": self.series(s.unusable),
            "allocator_unusable": self.series(s.allocator_unusable),
            "reserved_empty": self.series(s.reserved_empty),
            "failures": failures,
        }


def run_case(
    label: str,
    allocator: tuple[str, bool],
    spec: ModelSpec,
    geo: PoolGeometry,
    work: Workload,
    capacity: int,
    rules: str = "study",
) -> dict[str, object]:
    """One timeline on a fresh pool of `capacity` bytes, as a JSON-ready dict."""
    name, aware = allocator
    pool = JengaPool(geo, capacity, request_aware=aware)
    stats = Timeline(spec, pool, work, rules).run()
    return Run(label, name, stats, pool.capacity_bytes, pool.remainder_bytes()).to_json()


def run(args: argparse.Namespace) -> dict[str, object]:
    spec = get_spec(args.spec)
    geo = geometry_for_spec(spec)
    rng = random.Random(args.seed)
    prompts = tuple(rng.randint(args.min_tokens, args.max_tokens) for _ in range(args.requests))
    work = Workload(prompts, args.decode_tokens, args.chunk_tokens, args.decode_reserve)
    demand = demand_bytes(geo, work)
    cases = [
        (c, a, spec, geo, work, int(share * demand), args.engine_rules)
        for c, share in CAPACITIES
        for a in ALLOCATORS
    ]
    if args.jobs > 1:  # runs are independent and CPU-bound: one process each
        with ProcessPoolExecutor(args.jobs) as pool:
            runs = list(pool.map(run_case, *zip(*cases, strict=True)))
    else:
        runs = [run_case(*case) for case in cases]
    return {
        "spec": spec.name,
        "large_page_bytes": geo.large_page_bytes,
        "page_bytes": {str(t.ptype): t.page_bytes for t in geo.types},
        "pages_per_large": {str(t.ptype): t.per_large for t in geo.types},
        "requests": len(prompts),
        "prompt_tokens": sum(prompts),
        "decode_tokens": args.decode_tokens,
        "chunk_tokens": args.chunk_tokens,
        "decode_reserve": args.decode_reserve,
        "engine_rules": args.engine_rules,
        "demand_bytes": demand,
        "seed": args.seed,
        "results": runs,
    }


def _cell(series: object, key: str) -> float:
    assert isinstance(series, dict)
    value = series[key]
    assert isinstance(value, (int, float))
    return float(value)


def _row(r: dict[str, object]) -> str:
    failures = r["failures"]
    assert isinstance(failures, dict)
    fails = sum(f["count"] for f in failures.values())
    frag_fails = sum(f["fragmentation_caused"] for f in failures.values())
    at_fail = max((_cell(f["unusable"], "max_percent") for f in failures.values()), default=0.0)
    un, al, re_ = r["unusable"], r["allocator_unusable"], r["reserved_empty"]
    return (
        f"{r['capacity']:<5} {r['allocator']:<14} {_cell(r, 'capacity_bytes') / 2**30:>7.2f} "
        f"{r['steps']:>6} {r['preemptions']:>6} {_cell(r, 'avg_decode_batch'):>6.2f} "
        f"{_cell(r['held'], 'avg_percent'):>6.1f} "
        f"{_cell(un, 'avg_percent'):>7.3f} {_cell(un, 'max_percent'):>7.3f} "
        f"{_cell(r, 'remainder_bytes') / 2**20:>7.1f} {_cell(al, 'max_percent'):>7.3f} "
        f"{_cell(re_, 'avg_percent'):>7.3f} {_cell(re_, 'max_percent'):>7.3f} "
        f"{fails:>6} {frag_fails:>6} {at_fail:>7.3f}"
    )


def _table(report: dict[str, object]) -> str:
    demand = report["demand_bytes"]
    assert isinstance(demand, int)
    results = report["results"]
    assert isinstance(results, list)
    head = (
        f"{'cap':<5} {'allocator':<14} {'GiB':>7} {'steps':>6} {'preem':>6} {'batch':>6} "
        f"{'held%':>6} {'unus%':>7} {'max%':>7} {'remMiB':>7} {'alloc%':>7} "
        f"{'resv%':>7} {'max%':>7} {'fails':>6} {'frag':>6} {'@fail%':>7}"
    )
    return "\n".join(
        [
            f"spec {report['spec']}: L = {report['large_page_bytes']} bytes, pages per large "
            f"page {report['pages_per_large']}; {report['requests']} requests, "
            f"{report['prompt_tokens']} prompt tokens + {report['decode_tokens']} decode each, "
            f"chunk {report['chunk_tokens']}; demand {demand / 2**30:.2f} GiB; "
            f"{report['engine_rules']} rules",
            head,
            *(_row(r) for r in results),
        ]
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--spec", default="nemotron-h-8b")
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--min-tokens", type=int, default=55_000)
    p.add_argument("--max-tokens", type=int, default=110_000)
    p.add_argument("--decode-tokens", type=int, default=2_000)
    p.add_argument("--chunk-tokens", type=int, default=8_192)
    p.add_argument("--decode-reserve", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--engine-rules",
        choices=RULES,
        default="study",
        help="the study's engine rules (default) or the engine replays' (comparable figures; "
        "--decode-reserve is then unused: 256 tokens are reserved)",
    )
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes")
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
