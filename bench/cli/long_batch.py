"""`jenga-bench long-batch`: flags, table and plot of bench/studies/long_batch.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from jenga_sglang.bench.studies.long_batch import (
    MEMORIES,
    TARGET_RATIO,
    Workload,
    compare,
    long_context_batch,
)

DEFAULT_GB = "54,24,18,8"
COLORS = ("tab:blue", "tab:orange", "tab:red", "tab:green")  # in MEMORIES' order


def add_long_batch_parser(subparsers: Any) -> argparse.ArgumentParser:
    from jenga_sglang.bench.cli.args import cost_pair, floats, names

    p: argparse.ArgumentParser = subparsers.add_parser(
        "long-batch",
        help="long-context batch in engine mode: Jenga pool vs SGLang's two memory modes",
    )
    p.add_argument("--model", default="nemotron-h-8b")
    p.add_argument("--cache-gb", type=floats, default=floats(DEFAULT_GB), help="budgets, GB")
    p.add_argument(
        "--memories",
        type=names,
        default=list(MEMORIES),
        help=f"memories to run, in this order (default {','.join(MEMORIES)}); sglang-unified "
        "imports sglang (15-27 s)",
    )
    p.add_argument("--policy", default="sglang-lru", help="cache policy bundle of every run")
    w = Workload()
    for name in ("requests", "min_input", "max_input", "min_output", "max_output", "seed"):
        flag = "--" + name.replace("_", "-")
        p.add_argument(flag, type=int, default=getattr(w, name), help=f"default {getattr(w, name)}")
    p.add_argument("--chunk-tokens", type=int, default=8192, help="prefill tokens per step")
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--decode-reserve", type=int, default=256, help="decode tokens reserved")
    p.add_argument("--cost", type=cost_pair, action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--check", action="store_true", help="integrity after every step (slow)")
    p.add_argument("--json", action="store_true", help="one JSON object per budget")
    p.add_argument("--plot", help="PNG: decode batch and memory by kind over time")
    p.add_argument("--write-trace", help="also write the workload as a trace file")
    p.set_defaults(func=cmd_long_batch)
    return p


def cmd_long_batch(args: argparse.Namespace) -> int:
    from jenga_sglang.bench.cli.args import BadInput
    from jenga_sglang.bench.runs.runner import GB
    from jenga_sglang.bench.simulation.cost_model import CostModel
    from jenga_sglang.bench.simulation.engine import EngineConfig
    from jenga_sglang.bench.traces.packed import pack
    from jenga_sglang.bench.traces.trace import write_trace
    from jenga_sglang.models.presets import get_spec

    try:
        work = Workload(
            args.requests, args.min_input, args.max_input, args.min_output, args.max_output,
            args.seed,
        )  # fmt: skip
        spec = get_spec(args.model)
        cost = CostModel.with_overrides(dict(args.cost))
        config = EngineConfig(args.chunk_tokens, args.max_running, args.decode_reserve)
        trace = long_context_batch(work)
        unknown = [m for m in args.memories if m not in MEMORIES]
        if unknown or not args.memories:
            raise ValueError(f"unknown memories {unknown}; known: {', '.join(MEMORIES)}")
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if args.write_trace:
        write_trace(args.write_trace, trace, {"builder": "long_context_batch", **vars(work)})
    requests = pack(trace)
    results = []
    for gb in args.cache_gb:
        try:
            result = compare(
                requests, spec, round(gb * GB), args.policy, cost, config, args.check,
                args.memories,
            )  # fmt: skip
        except ValueError as exc:  # a budget SGLang's split cannot carve, an unknown policy
            raise BadInput(str(exc)) from None
        results.append(result)
        print(json.dumps(result) if args.json else table(result), flush=True)
    if args.plot:
        plot(results, args.plot)
    return 0


def table(result: dict[str, Any]) -> str:
    runs = result["runs"]
    head = (
        f"{'memory':<14} {'batch(t)':>8} {'batch/st':>8} {'max':>4} {'TTFT mean':>9} "
        f"{'p50':>7} {'max':>7} {'tok/s':>7} {'makespan':>8} {'retr':>5} {'KV held/pool':>14} "
        f"{'state held/pool':>16} {'moved GB':>9} {'moves':>8}"
    )
    lines = [_title(result), head]
    for m, r in runs.items():
        moved = f"{r['moved_bytes'] / 1e9:>9.2f} {_moves(r):>8}" if "moved_bytes" in r else ""
        lines.append(
            f"{m:<14} {r['decode_batch_time_weighted']:>8.3f} {r['decode_batch_per_step']:>8.3f} "
            f"{r['decode_batch_max']:>4} {r['ttft_mean_s']:>9.2f} {r['ttft_p50_s']:>7.2f} "
            f"{r['ttft_max_s']:>7.2f} {r['throughput_tok_s']:>7.1f} {r['makespan_s']:>8.2f} "
            f"{r['retractions']:>5} {_share(r, 'kv'):>14} {_share(r, 'state'):>16} {moved}"
        )
    return "\n".join(lines)


def _title(result: dict[str, Any]) -> str:
    parts = [f"cache {result['cache_gb']:g} GB"]
    if result["ratio"] is not None:
        verdict = "met" if result["target_met"] else "not met"
        parts.append(f"ratio {result['ratio']:.3f} (target {TARGET_RATIO}: {verdict})")
    for key, what in (("of_unified", "SGLang's unified pool"), ("of_shared", "the shared budget")):
        if result[key] is not None:
            parts.append(f"{result[key]:.3f} of {what}'s batch")
    return ": ".join(parts[:2]) + "".join(f", {p}" for p in parts[2:])


def _plot_title(result: dict[str, Any]) -> str:
    keys = (("ratio", "split"), ("of_unified", "unified"), ("of_shared", "bytes"))
    ratios = [f"/{name} {result[key]:.2f}" for key, name in keys if result[key] is not None]
    return f"{result['cache_gb']:g} GB: decode batch (jenga {', '.join(ratios)})"


def _moves(run: dict[str, Any]) -> int:
    return int(run["moved_kv_pages"] + run["moved_state_pages"])


def _share(run: dict[str, Any], kind: str) -> str:
    held, pool = run[f"{kind}_held_mean_bytes"], run[f"{kind}_pool_bytes"]
    return f"{held / 1e9:.2f}/{pool / 1e9:.2f} GB"


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(12, 3.2 * len(results)), squeeze=False)
    for (left, right), result in zip(axes, results, strict=True):
        for m, run in result["runs"].items():
            color = COLORS[MEMORIES.index(m)]
            line = run["timeline"]
            left.step(line["t"], line["decode_batch"], where="post", color=color, label=m)
            right.plot(line["t"], [b / 1e9 for b in line["kv_held"]], color=color, label=f"{m} KV")
            right.plot(
                line["t"], [b / 1e9 for b in line["state_held"]], color=color, linestyle=":",
                label=f"{m} states",
            )  # fmt: skip
        split = result["runs"].get("sglang-split")
        for kind, style in (("kv", "--"), ("state", "-.")):
            if split is not None:
                pool = split[f"{kind}_pool_bytes"] / 1e9
                right.axhline(pool, color="gray", linestyle=style, lw=0.8)
        left.set_title(_plot_title(result), fontsize=9)
        right.set_title("bytes held by kind (gray: the split's KV / Mamba pools)")
        left.set_xlabel("simulated time (s)")
        right.set_xlabel("simulated time (s)")
        right.set_ylabel("GB")
        left.legend(fontsize=8)
        right.legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
