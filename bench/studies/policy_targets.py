"""The policy issue's targets from sweep records: bundles vs the per-configuration oracle.

    python -m jenga_sglang.bench.studies.policy_targets BUNDLES.jsonl ORACLE.jsonl [--markdown]

BUNDLES holds sweep records of jenga, marconi, sglang-lru and vllm-blocks; ORACLE those of
`marconi@A` for every alpha A of the grid. A configuration is (trace, cache size); the oracle of
a configuration is the best fixed alpha in hindsight (the highest token hit rate among the
`marconi@A` runs). Prints per-configuration hit rates and the summary figures the issue asks for.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from jenga_sglang.bench.traces.trace import open_text

Config = tuple[str, float]


def session_rate(trace: str) -> float:
    """Sessions per second from a ShareGPT trace's metadata line."""
    with open_text(trace, "r") as f:
        meta = json.loads(f.readline()).get("_meta", {})
    return float(meta.get("params", {}).get("rate", float("nan")))


def load(paths: Sequence[str]) -> list[dict]:  # type: ignore[type-arg]
    records = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records


def table(records: list[dict]) -> tuple[dict[Config, dict[str, float]], dict[Config, float]]:  # type: ignore[type-arg]
    rates: dict[Config, dict[str, float]] = defaultdict(dict)
    best_alpha: dict[Config, float] = {}
    for r in records:
        if r.get("error"):
            raise ValueError(f"failed run in the records: {r}")
        if r["capacity_violations"]:
            raise ValueError(f"capacity violated: {r}")
        config = (r["trace"], float(r["cache_gb"]))
        name = r["policy"]
        if name.startswith("marconi@"):
            if r["token_hit_rate"] > rates[config].get("oracle", -1.0):
                rates[config]["oracle"] = r["token_hit_rate"]
                best_alpha[config] = float(name.partition("@")[2])
        else:
            rates[config][name] = r["token_hit_rate"]
    return rates, best_alpha


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


NAMES = ("jenga", "oracle", "marconi", "sglang-lru", "vllm-blocks")


REQUIRED = ("jenga", "oracle", "sglang-lru")


def summary(rates: dict[Config, dict[str, float]]) -> dict[str, float]:
    """Figures over the configurations that have jenga, the oracle and sglang-lru (the others
    are counted); the marconi and vllm-blocks figures only when every one of those has them
    (a grid of `--policies jenga,sglang-lru` checks jenga's targets alone)."""
    configs = sorted(c for c in rates if all(n in rates[c] for n in REQUIRED))
    if not configs:
        raise ValueError(f"no configuration has all of {REQUIRED}")
    names = [n for n in NAMES if all(n in rates[c] for c in configs)]
    col = {name: [rates[c][name] for c in configs] for name in names}
    out = {f"mean_{name}": statistics.fmean(v) for name, v in col.items()}
    if "marconi" in names and "vllm-blocks" in names:
        gain = [rates[c]["marconi"] / rates[c]["sglang-lru"] - 1 for c in configs]
        out["marconi_over_vllm_mean_of_ratios"] = statistics.fmean(
            rates[c]["marconi"] / rates[c]["vllm-blocks"] for c in configs
        )
        out["marconi_over_vllm_ratio_of_means"] = out["mean_marconi"] / out["mean_vllm-blocks"]
        out["marconi_vs_sglang_lru_p95_gain"] = p95(gain)
        out["marconi_below_sglang_lru_configs"] = sum(g < 0 for g in gain)
    out["jenga_below_sglang_lru_configs"] = sum(
        rates[c]["jenga"] < rates[c]["sglang-lru"] for c in configs
    )
    out["jenga_min_ratio_to_sglang_lru"] = min(
        rates[c]["jenga"] / rates[c]["sglang-lru"] for c in configs
    )
    out["configs"] = len(configs)
    out["incomplete_configs"] = len(rates) - len(configs)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+")
    args = parser.parse_args(argv)
    rates, best_alpha = table(load(args.records))
    names = list(NAMES)
    print("| sessions/s | GB | " + " | ".join(names) + " | oracle alpha |")
    print("|---:|---:|" + "---:|" * (len(names) + 1))
    for config in sorted(rates, key=lambda c: (session_rate(c[0]), c[1])):
        row = " | ".join(f"{rates[config].get(n, float('nan')):.4f}" for n in names)
        rate = session_rate(config[0])
        print(f"| {rate:g} | {config[1]:g} | {row} | {best_alpha.get(config, float('nan')):.1f} |")
    print()
    for key, value in summary(rates).items():
        print(f"- {key}: {value:.4f}" if isinstance(value, float) else f"- {key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
