"""`jenga-bench overhead`: flags, progress and table of bench/studies/overhead.py."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from jenga_sglang.bench.studies.overhead import (
    CACHES,
    Measured,
    Point,
    build_cache,
    measure,
    median,
    warm,
)


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def add_overhead_parser(subparsers: Any) -> argparse.ArgumentParser:
    from jenga_sglang.bench.cli.args import names

    p: argparse.ArgumentParser = subparsers.add_parser(
        "overhead",
        help="scheduler CPU per request: our cache vs SGLang's, same SGLang calls and stream",
    )
    p.add_argument(
        "--caches",
        type=names,
        default=["jenga", "sglang-native"],
        help=f"of {', '.join(CACHES)} (jenga-host: ours with the live host tier on)",
    )
    p.add_argument("--nodes", type=_ints, default=[10_000, 100_000], help="tree sizes")
    p.add_argument("--prompt-tokens", type=_ints, default=[1024, 32768, 131072])
    p.add_argument("--running", type=int, default=256, help="requests in flight")
    p.add_argument("--requests", type=int, default=64, help="measured requests per point")
    p.add_argument(
        "--repeats", type=int, default=3, help="measurements per point; the median is reported"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON object per measurement")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_overhead)
    return p


def cmd_overhead(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from jenga_sglang.bench.cli.args import BadInput

    unknown = [c for c in args.caches if c not in CACHES]
    if unknown or min(args.running, args.requests, args.repeats) <= 0:
        raise BadInput(f"caches must be of {', '.join(CACHES)} (got {unknown}); "
                       "--running, --requests and --repeats must be > 0")  # fmt: skip
    # One thread, as the figure is the scheduler thread's CPU: torch would hand large CPU ops
    # (SGLang's free-list merges) to helper threads, uncounted, and on a loaded machine wait
    # for them (60 ms per Mamba free, 2 hours to warm 100k nodes of SGLang's cache).
    torch.set_num_threads(1)
    per_point = args.repeats * args.requests
    work = len(args.caches) * sum(n + len(args.prompt_tokens) * per_point for n in args.nodes)
    bar = tqdm(total=work, desc="overhead", unit="req", disable=args.no_progress, file=sys.stderr)
    rows: list[Measured] = []
    for nodes in args.nodes:
        stream = len(args.prompt_tokens) * args.repeats * (args.running + args.requests)
        built: dict[str, Any] = {}
        for cache in args.caches:
            built[cache] = build_cache(cache, nodes, max(args.prompt_tokens), args.running, stream)
            bar.set_postfix_str(f"{cache}, warming {nodes} nodes")
            warm(built[cache], nodes, args.seed, lambda: bar.update())
        for prompt in args.prompt_tokens:
            bar.set_postfix_str(f"{nodes} nodes, {prompt}-token prompts")
            runs: dict[str, list[Measured]] = {cache: [] for cache in args.caches}
            for i in range(args.repeats):
                # Caches take turns: a shared machine's load drifts over minutes, and turns
                # put each drift on both sides instead of on whichever ran second.
                for cache in args.caches:
                    point = Point(cache, nodes, prompt, args.running)
                    seed = args.seed + i
                    runs[cache].append(
                        measure(built[cache], point, args.requests, seed, lambda: bar.update())
                    )
            for cache in args.caches:
                row = median(runs[cache])
                rows.append(row)
                if args.json:
                    print(json.dumps(row.row()), flush=True)
        built.clear()  # the next tree size builds its own pools
    bar.close()
    if not args.json:
        print(_table(rows))
    return 0


def _table(rows: list[Measured]) -> str:
    lines = [
        "| cache | nodes | prompt tokens | running | bookkeeping ms/request | tensor ms/request |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.cache} | {r.nodes} | {r.prompt_tokens} | {r.running} | "
            f"{r.bookkeeping_ms_per_request:.3f} | {r.tensor_ms_per_request:.3f} |"
        )
    return "\n".join(lines)
