"""`jenga-bench long-batch`: flags, table and plot of bench/long_batch.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from jenga_sglang.bench.long_batch import (
    MEMORIES,
    TARGET_RATIO,
    Workload,
    compare,
    long_context_batch,
)

DEFAULT_GB = "54,24,18,8"


def add_long_batch_parser(subparsers: Any) -> argparse.ArgumentParser:
    from jenga_sglang.bench.cli import _cost, _floats

    p: argparse.ArgumentParser = subparsers.add_parser(
        "long-batch",
        help="long-context batch in engine mode: Jenga pool vs SGLang's static KV/Mamba split",
    )
    p.add_argument("--model", default="nemotron-h-8b")
    p.add_argument("--cache-gb", type=_floats, default=_floats(DEFAULT_GB), help="budgets, GB")
    p.add_argument("--policy", default="sglang-lru", help="cache policy bundle of both runs")
    w = Workload()
    for name in ("requests", "min_input", "max_input", "min_output", "max_output", "seed"):
        flag = "--" + name.replace("_", "-")
        p.add_argument(flag, type=int, default=getattr(w, name), help=f"default {getattr(w, name)}")
    p.add_argument("--chunk-tokens", type=int, default=8192, help="prefill tokens per step")
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--decode-reserve", type=int, default=256, help="decode tokens reserved")
    p.add_argument("--cost", type=_cost, action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--check", action="store_true", help="integrity after every step (slow)")
    p.add_argument("--json", action="store_true", help="one JSON object per budget")
    p.add_argument("--plot", help="PNG: decode batch and memory by kind over time")
    p.add_argument("--write-trace", help="also write the workload as a trace file")
    p.set_defaults(func=cmd_long_batch)
    return p


def cmd_long_batch(args: argparse.Namespace) -> int:
    from jenga_sglang.bench.cli import BadInput
    from jenga_sglang.bench.cost_model import CostModel
    from jenga_sglang.bench.engine import EngineConfig
    from jenga_sglang.bench.replay import pack
    from jenga_sglang.bench.runner import GB
    from jenga_sglang.bench.trace import write_trace
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
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if args.write_trace:
        write_trace(args.write_trace, trace, {"builder": "long_context_batch", **vars(work)})
    requests = pack(trace)
    results = []
    for gb in args.cache_gb:
        try:
            result = compare(requests, spec, round(gb * GB), args.policy, cost, config, args.check)
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
        f"{'memory':<13} {'batch(t)':>8} {'batch/st':>8} {'max':>4} {'TTFT mean':>9} "
        f"{'p50':>7} {'max':>7} {'tok/s':>7} {'makespan':>8} {'retr':>5} {'KV held/pool':>14} "
        f"{'state held/pool':>16}"
    )
    verdict = "met" if result["target_met"] else "not met"
    title = f"cache {result['cache_gb']:g} GB: ratio {result['ratio']:.3f} "
    shared = f", {result['of_shared']:.3f} of the shared byte budget's batch"
    lines = [title + f"(target {TARGET_RATIO}: {verdict}){shared}", head]
    for m in MEMORIES:
        r = runs[m]
        lines.append(
            f"{m:<13} {r['decode_batch_time_weighted']:>8.3f} {r['decode_batch_per_step']:>8.3f} "
            f"{r['decode_batch_max']:>4} {r['ttft_mean_s']:>9.2f} {r['ttft_p50_s']:>7.2f} "
            f"{r['ttft_max_s']:>7.2f} {r['throughput_tok_s']:>7.1f} {r['makespan_s']:>8.2f} "
            f"{r['retractions']:>5} {_share(r, 'kv'):>14} {_share(r, 'state'):>16}"
        )
    return "\n".join(lines)


def _share(run: dict[str, Any], kind: str) -> str:
    held, pool = run[f"{kind}_held_mean_bytes"], run[f"{kind}_pool_bytes"]
    return f"{held / 1e9:.2f}/{pool / 1e9:.2f} GB"


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(12, 3.2 * len(results)), squeeze=False)
    for (left, right), result in zip(axes, results, strict=True):
        for m, color in zip(MEMORIES, ("tab:blue", "tab:orange", "tab:green"), strict=True):
            line = result["runs"][m]["timeline"]
            left.step(line["t"], line["decode_batch"], where="post", color=color, label=m)
            right.plot(line["t"], [b / 1e9 for b in line["kv_held"]], color=color, label=f"{m} KV")
            right.plot(
                line["t"], [b / 1e9 for b in line["state_held"]], color=color, linestyle=":",
                label=f"{m} states",
            )  # fmt: skip
        split = result["runs"]["sglang-split"]
        for kind, style in (("kv", "--"), ("state", "-.")):
            right.axhline(split[f"{kind}_pool_bytes"] / 1e9, color="gray", linestyle=style, lw=0.8)
        left.set_title(f"{result['cache_gb']:g} GB: decode batch (ratio {result['ratio']:.2f})")
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
