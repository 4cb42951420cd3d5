"""`jenga-bench robustness [--full | --held-out]`: build the families' traces, sweep, table,
JSON and plot.

    jenga-bench robustness --jobs 2                  # a few minutes on 2 cores (compiled build)
    jenga-bench robustness --full --jobs 2 --json    # more rates, budgets, lengths and skews
    jenga-bench robustness --held-out --jobs 2       # other seeds and rates: a rule chosen on
                                                     # the two sets above, checked on new traces

Writes under `--out` (default out/robustness): `records.jsonl` (every run's sweep record),
`robustness.md` (the table) and `robustness.png`; prints the table, or with `--json` one JSON
object (summary per family and one row per configuration). `--records FILE` re-reads the runs
of an earlier call instead of sweeping. Exit status 1 when a configuration misses a target.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jenga_sglang.bench.studies.robustness import (
    BASELINES,
    DEFAULT,
    FULL,
    HELD_OUT,
    HELD_OUT_RATES,
    HELD_OUT_SEED,
    MAX_POINTS_BELOW_BASELINE,
    MIN_FRACTION_OF_ORACLE,
    ORACLE_GRID,
    Family,
    configs_from,
    oracle_policies,
    summarise,
)


def add_robustness_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "robustness",
        help="jenga vs marconi, sglang-lru and the best fixed alpha on every workload family",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--full", action="store_true", help="the larger set of workloads and budgets"
    )
    which.add_argument(
        "--held-out",
        action="store_true",
        help=f"generators at seed {HELD_OUT_SEED}, ShareGPT at "
        f"{' and '.join(f'{r:g}' for r in HELD_OUT_RATES)} sessions/s: "
        "traces no policy rule was chosen on",
    )
    p.add_argument("--model", default="marconi-7b")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--out", type=Path, default=Path("out/robustness"))
    p.add_argument("--cache-dir", type=Path, default=Path("data/traces"), help="trace cache")
    p.add_argument("--records", type=Path, help="re-read this records.jsonl instead of sweeping")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_robustness)
    return p


def _traces(
    families: Sequence[Family], cache_dir: Path, progress: bool
) -> dict[str, tuple[str, str, tuple[float, ...]]]:
    """Trace path -> (family, workload label, budgets), building what the cache lacks."""
    from tqdm import tqdm

    from jenga_sglang.bench.traces.build import cached_trace

    work = [(f.name, w) for f in families for w in f.workloads]
    where: dict[str, tuple[str, str, tuple[float, ...]]] = {}
    for family, w in tqdm(work, desc="traces", file=sys.stderr, disable=not progress):
        path = str(cached_trace(w.kind, w.params, cache_dir))
        where[path] = (family, w.label, w.budgets)
    return where


def _sweep(
    where: dict[str, tuple[str, str, tuple[float, ...]]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    from jenga_sglang.bench.runs.runner import RunConfig
    from jenga_sglang.bench.runs.sweep import sweep, write_records

    policies = ["jenga", *BASELINES, *oracle_policies()]
    configs = [
        RunConfig(trace=t, model=args.model, cache_gb=gb, policy=p)
        for t, (_, _, budgets) in where.items()
        for gb in budgets
        for p in policies
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "records.jsonl", "w", encoding="utf-8") as f:
        return write_records(
            sweep(configs, jobs=args.jobs, progress=not args.no_progress), f, "json"
        )


def markdown(summary: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| family | configs | meet targets | worst jenga / best baseline | worst points over it "
        "| worst jenga / best fixed alpha |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for f in summary:
        lines.append(
            f"| {f['family']} | {f['configs']} | {f['met']} | {f['worst_ratio_to_baseline']:.3f} "
            f"| {f['worst_points_over_baseline']:+.2f} | {f['worst_ratio_to_oracle']:.3f} |"
        )
    lines += [
        "",
        "| family | workload | GB | jenga | marconi | sglang-lru | best fixed alpha (A) "
        "| jenga - best baseline (points) | jenga / best fixed alpha |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = {f["family"]: i for i, f in enumerate(summary)}
    for r in sorted(rows, key=lambda r: (order[r["family"]], r["workload"], r["cache_gb"])):
        flag = "" if r["meets_targets"] else " **miss**"
        lines.append(
            f"| {r['family']} | {r['workload']} | {r['cache_gb']:g} | {r['jenga']:.4f} "
            f"| {r['marconi']:.4f} | {r['sglang-lru']:.4f} | {r['oracle']:.4f} "
            f"({r['oracle_alpha']:g}) | {r['points_over_baseline']:+.2f} "
            f"| {r['ratio_to_oracle']:.3f}{flag} |"
        )
    return "\n".join(lines) + "\n"


def plot(summary: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Per configuration, grouped by family: jenga / best baseline and jenga / best fixed alpha."""
    from jenga_sglang.bench.studies.report import pyplot, save_png

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(8.0, 0.28 * len(rows)), 4.5))
    order = {f["family"]: i for i, f in enumerate(summary)}
    ranked = sorted(rows, key=lambda r: (order[r["family"]], r["workload"], r["cache_gb"]))
    xs = range(len(ranked))
    ax.scatter(
        xs,
        [r["ratio_to_baseline"] for r in ranked],
        marker="o",
        label="jenga / best of marconi, sglang-lru",
    )
    ax.scatter(
        xs, [r["ratio_to_oracle"] for r in ranked], marker="x", label="jenga / best fixed alpha"
    )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(MIN_FRACTION_OF_ORACLE, color="red", lw=0.8, ls="--", label="97% target")
    start = 0
    for f in summary:
        n = f["configs"]
        ax.axvspan(start - 0.5, start + n - 0.5, alpha=0.06 * (1 + order[f["family"]] % 2))
        ax.text(start + n / 2 - 0.5, 0.02, f["family"], ha="center", va="bottom",
                transform=ax.get_xaxis_transform(), fontsize=8)  # fmt: skip
        start += n
    ax.set_xticks([])
    ax.set_yscale("log")  # ratios near 1 matter; a few configurations reach 10x
    ax.set_ylabel("token hit rate ratio (log)")
    ax.set_title("jenga on every workload family (marconi-7b, sequential replay)")
    ax.legend(fontsize=8, loc="upper right")
    return Path(save_png(fig, path))


def cmd_robustness(args: argparse.Namespace) -> int:
    from jenga_sglang.bench.studies.report import read_records

    families = HELD_OUT if args.held_out else FULL if args.full else DEFAULT
    where = _traces(families, args.cache_dir, not args.no_progress)
    records = read_records([args.records]) if args.records else _sweep(where, args)
    records = [r for r in records if r["trace"] in where]
    rows = [c.row(ORACLE_GRID) for c in configs_from(records, where)]
    summary = summarise(rows)
    table = markdown(summary, rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "robustness.md").write_text(table, encoding="utf-8")
    png = plot(summary, rows, args.out / "robustness.png")
    if args.json:
        print(json.dumps({"summary": summary, "configs": rows}, separators=(",", ":")))
    else:
        print(table)
    print(f"wrote {png}", file=sys.stderr)
    targets = f"points >= -{MAX_POINTS_BELOW_BASELINE}, ratio to oracle >= {MIN_FRACTION_OF_ORACLE}"
    missed = sum(not r["meets_targets"] for r in rows)
    print(f"{len(rows) - missed} of {len(rows)} configurations meet the targets ({targets})",
          file=sys.stderr)  # fmt: skip
    return 1 if missed else 0
