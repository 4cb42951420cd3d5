"""`jenga-bench`: replays, sweeps, reports, trace builders, live loads and every study.

Subcommands: replay, sweep, report, demo, traces, online, soak, long-batch, overhead,
robustness, and the studies that keep their own flags (bench/cli/studies.py: fragmentation,
eviction, kernels, agent-bounds, policy-targets, e2e-cpu, e2e-models, bench-serving,
demo-serve; `jenga-bench STUDY --help`).

    jenga-bench replay --trace PATH --model marconi-7b --cache-gb 2 --policy jenga --json
    jenga-bench replay --trace PATH --cache-gb 2 --policy marconi --via sglang --json
    jenga-bench replay --trace PATH --cache-gb 2 --cache sglang-native --json
    jenga-bench sweep --trace A --trace B --cache-gb 1,2,5 --policies jenga,marconi --json
    jenga-bench sweep --trace A --cache-gb 5,10 --caches jenga,sglang-native --json
    jenga-bench report sweep.jsonl --out out/report
    jenga-bench traces build sharegpt --rate 1
    jenga-bench demo
    jenga-bench long-batch --cache-gb 54,24,18,8 --plot out/long-batch.png
    jenga-bench overhead --nodes 10000,100000 --prompt-tokens 1024,32768,131072 --json
    jenga-bench robustness --jobs 2

The cache under test (`--cache`, `--caches`) is ours, `jenga`, running the bundle `--policy`
names, or SGLang's own (`sglang-native`: its static KV/Mamba split; `sglang-native-unified`: its
unified pool), which runs SGLang's LRU and takes no `--policy`. `--via sglang` drives ours
through SGLang's real pools and scheduler helpers instead of the simulator.

Bad input (missing or malformed trace, unknown policy / model / mode) prints one line on
stderr and exits with status 2. Subcommands import what they need when they run: the
pure-Python policies never load torch or sglang.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from jenga_sglang.bench.cli.args import (
    EXIT_BAD_INPUT,
    BadInput,
    checked,
    cost_pair,
    floats,
    host_size,
    names,
)
from jenga_sglang.bench.cli.long_batch import add_long_batch_parser
from jenga_sglang.bench.cli.online import add_online_parser
from jenga_sglang.bench.cli.overhead import add_overhead_parser
from jenga_sglang.bench.cli.robustness import add_robustness_parser
from jenga_sglang.bench.cli.studies import add_study_parsers
from jenga_sglang.bench.cli.traces import add_traces_parser
from jenga_sglang.bench.drivers.sglang_run import CACHES, OURS
from jenga_sglang.bench.studies.soak import add_soak_parser

DEFAULT_POLICIES = ["jenga", "marconi", "sglang-lru", "vllm-blocks"]


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="marconi-7b", help="model preset (default marconi-7b)")
    p.add_argument("--mode", default="sequential", choices=("sequential", "engine"))
    p.add_argument(
        "--memory",
        default="bytes",
        choices=("bytes", "jenga", "sglang-split", "sglang-unified"),
        help="byte budget (Marconi's accounting), the Jenga two-level pool, SGLang's static "
        "KV/Mamba split of the budget (--mamba-full-memory-ratio 0.9), or SGLang's "
        "--enable-unified-memory pool (its real allocators; imports sglang, 15-27 s)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="check cache integrity after every request / engine step (slow)",
    )
    p.add_argument(
        "--cost",
        type=cost_pair,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a cost model constant (engine mode), e.g. mfu=0.4",
    )
    p.add_argument("--chunk-tokens", type=int, default=8192, help="prefill tokens per step")
    p.add_argument(
        "--via",
        default="",
        choices=("", "sglang"),
        help="sglang: drive our cache (--cache jenga, any --policy) as SGLang's cache backend "
        "on SGLang's pools (slow start)",
    )
    p.add_argument("--max-running", type=int, default=256, help="requests per batch at most")
    p.add_argument(
        "--host-gb",
        type=host_size,
        default="0",
        metavar="G|Rx",
        help="a host-memory tier of G GB under the cache, or R times --cache-gb (0, the "
        "default: none; docs/host-tier.md)",
    )
    p.add_argument(
        "--host-bw", type=float, default=25.0, help="host <-> device GB/s (default 25: PCIe 4)"
    )
    p.add_argument(
        "--int8-checkpoints",
        action="store_true",
        help="store SSM checkpoints as SGLang's --enable-int8-mamba-checkpoint does (int8 with "
        "per-channel scales: Mamba2 and linear-attention states; sequential replay)",
    )
    p.add_argument(
        "--hicache-write-policy",
        default="write_through",
        choices=("write_through", "write_through_selective", "write_back"),
        help="--cache sglang-native-hicache: SGLang's HiCache write policy (its default: "
        "write_through)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jenga-bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    rp = sub.add_parser("replay", help="replay one trace through one cache")
    rp.add_argument("--trace", required=True)
    rp.add_argument("--cache-gb", type=float, required=True)
    rp.add_argument(
        "--cache",
        default=OURS,
        choices=CACHES,
        help="the cache under test: ours (default) or SGLang's own (static split, unified pool)",
    )
    rp.add_argument(
        "--policy", help=f"bundle of --cache {OURS}: a name or marconi@ALPHA (policies/README.md)"
    )
    rp.add_argument("--json", action="store_true", help="print one JSON object")
    _add_run_flags(rp)
    rp.set_defaults(func=cmd_replay)

    sp = sub.add_parser("sweep", help="every trace x cache size x policy, in parallel")
    sp.add_argument("--trace", action="append", required=True)
    sp.add_argument("--cache-gb", type=floats, required=True, help="e.g. 1,2,3,4,5,10")
    sp.add_argument(
        "--caches",
        type=names,
        default=[OURS],
        help=f"caches under test, of {','.join(CACHES)} (default {OURS})",
    )
    sp.add_argument(
        "--policies",
        type=names,
        default=None,
        help=f"bundles of --caches {OURS} (default {','.join(DEFAULT_POLICIES)})",
    )
    fmt = sp.add_mutually_exclusive_group()
    fmt.add_argument("--json", dest="fmt", action="store_const", const="json", default="json")
    fmt.add_argument("--csv", dest="fmt", action="store_const", const="csv")
    sp.add_argument("--out", help="write records here instead of stdout")
    sp.add_argument("--jobs", type=int, default=None, help="worker processes (default: cores)")
    sp.add_argument("--no-progress", action="store_true")
    _add_run_flags(sp)
    sp.set_defaults(func=cmd_sweep)

    rep = sub.add_parser("report", help="markdown table and PNG plots from sweep records")
    rep.add_argument("records", nargs="+", help="JSON-lines files written by sweep --json")
    rep.add_argument("--out", default="out/report", help="directory for report.md and PNGs")
    rep.set_defaults(func=cmd_report)

    demo = sub.add_parser("demo", help="build traces, sweep a small grid, report (make demo)")
    demo.add_argument("--out", default="out/demo")
    demo.set_defaults(func=cmd_demo)

    for add in (
        add_traces_parser,
        add_online_parser,
        add_soak_parser,
        add_long_batch_parser,
        add_overhead_parser,
        add_robustness_parser,
        add_study_parsers,
    ):
        add(sub)
    return parser


def _common(args: argparse.Namespace) -> dict[str, Any]:
    from jenga_sglang.bench.simulation.engine import EngineConfig

    return {
        "mode": args.mode,
        "memory": args.memory,
        "check": args.check,
        "cost": tuple(args.cost),
        "engine": EngineConfig(chunk_tokens=args.chunk_tokens, max_running=args.max_running),
        "via": args.via,
        "host_bw": args.host_bw,
        "hicache_write": args.hicache_write_policy,
        "int8_checkpoints": args.int8_checkpoints,
    }


def _host_gb(size: str, cache_gb: float) -> float:
    """A host tier's GB: `size` GB, or "Rx" for R times the cache size."""
    return float(size[:-1]) * cache_gb if size.endswith("x") else float(size)


def cmd_replay(args: argparse.Namespace) -> int:
    from jenga_sglang.bench.runs.runner import RunConfig, load_packed, run, validate

    if args.cache == OURS and not args.policy:
        raise BadInput(f"replay --cache {OURS} needs --policy NAME")
    policy = args.policy or ""
    host_gb = _host_gb(args.host_gb, args.cache_gb)
    config = checked(
        lambda: RunConfig(
            args.trace,
            args.model,
            args.cache_gb,
            policy,
            cache=args.cache,
            host_gb=host_gb,
            **_common(args),
        )
    )
    checked(validate, config)
    checked(load_packed, config.trace)
    record = run(config)
    if args.json:
        print(json.dumps(record, separators=(",", ":")))
    else:
        skip = ("timeline", "ttft_cdf_s")
        for key, value in record.items():
            if key not in skip:
                print(f"{key:>20}: {value}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from jenga_sglang.bench.runs.runner import preload
    from jenga_sglang.bench.runs.sweep import grid, sweep, write_records

    configs = checked(lambda: _sweep_grid(args, grid))
    checked(preload, args.trace, args.jobs or os.cpu_count() or 1)
    records = sweep(configs, jobs=args.jobs, progress=not args.no_progress)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            kept = write_records(records, f, args.fmt)
    else:
        kept = write_records(records, sys.stdout, args.fmt)
    failed = [r for r in kept if "error" in r]
    for r in failed:
        print(
            f"jenga-bench: run failed: {r['policy']} {r['cache_gb']} GB {r['trace']}: {r['error']}",
            file=sys.stderr,
        )
    return 1 if failed else 0


def _sweep_grid(args: argparse.Namespace, grid: Any) -> list[Any]:
    """Every trace x size for each cache: ours once per policy, SGLang's own once."""
    unknown = [c for c in args.caches if c not in CACHES]
    if unknown or not args.caches:
        raise ValueError(f"unknown caches {unknown}; known: {', '.join(CACHES)}")
    if args.policies is not None and OURS not in args.caches:
        raise ValueError(f"--policies applies to --caches {OURS}, not to {','.join(args.caches)}")
    configs: list[Any] = []
    for cache in dict.fromkeys(args.caches):
        policies = (args.policies or DEFAULT_POLICIES) if cache == OURS else [""]
        common = {**_common(args), "cache": cache}
        for gb in args.cache_gb:  # the host tier may be sized per cache size ("Rx")
            host = {"host_gb": _host_gb(args.host_gb, gb)}
            configs += grid(args.trace, args.model, [gb], policies, **common, **host)
    return configs


def cmd_report(args: argparse.Namespace) -> int:
    from jenga_sglang.bench.studies.report import read_records, write_report

    table, pngs = write_report(checked(read_records, args.records), args.out)
    print(table)
    for path in pngs:
        print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from jenga_sglang.bench.cli.demo import run_demo

    return run_demo(args.out)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except BadInput as exc:  # one line, no traceback; bugs still raise with theirs
        print(f"jenga-bench: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return code


if __name__ == "__main__":
    sys.exit(main())
