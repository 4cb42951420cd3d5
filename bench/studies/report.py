"""Reports from sweep records: a markdown table and PNG plots (matplotlib, Agg backend).

* `hitrate-<trace>.png`: token hit rate vs cache size, one line per policy (one per trace and
  mode);
* `ttft-cdf-<trace>-<gb>GB.png`: TTFT CDF per policy (engine records);
* `memory-<trace>-<gb>GB.png`: memory over time stacked used / evictable / free / wasted, one
  panel per policy, with the decode batch size on a second axis (engine records; Jenga Fig. 16).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

Record = dict[str, Any]


def trace_name(record: Record) -> str:
    name = Path(str(record.get("trace", "?"))).name
    return re.sub(r"\.jsonl(\.gz|\.xz)?$", "", name)


def read_records(paths: Sequence[str | Path]) -> list[Record]:
    """Records from JSON-lines files; a bad line raises ValueError naming file and line."""
    out: list[Record] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not a JSON record: {e.msg}") from None
                if not isinstance(rec, dict):
                    raise ValueError(f"{path}:{lineno}: expected a JSON object")
                out.append(rec)
    return out


def _ok(records: Iterable[Record]) -> list[Record]:
    return [r for r in records if "error" not in r and "token_hit_rate" in r]


def _policies(records: Sequence[Record]) -> list[str]:
    return list(dict.fromkeys(str(r["policy"]) for r in records))


def markdown_table(records: Sequence[Record]) -> str:
    """Token hit rate (%) per trace x mode x cache size (rows) and policy (columns).

    Engine records add P95 TTFT (s) after the hit rate.
    """
    good = _ok(records)
    if not good:
        return "_no successful runs_\n"
    policies = _policies(good)
    cells: dict[tuple[str, str, float], dict[str, Record]] = defaultdict(dict)
    for r in good:
        cells[(trace_name(r), str(r["mode"]), float(r["cache_gb"]))][str(r["policy"])] = r
    head = "| trace | mode | cache GB | " + " | ".join(policies) + " |"
    lines = [head, "|" + "---|" * (3 + len(policies))]
    for key in sorted(cells):
        row = [_cell(cells[key].get(p)) for p in policies]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]:g} | " + " | ".join(row) + " |")
    errors = len(records) - len(good)
    note = f"\n{errors} run(s) failed (see their `error` field).\n" if errors else ""
    return (
        "Token hit rate %"
        + (" / P95 TTFT s" if any("ttft_p95_s" in r for r in good) else "")
        + "\n\n"
        + "\n".join(lines)
        + "\n"
        + note
    )


def _cell(r: Record | None) -> str:
    if r is None:
        return "-"
    text = f"{100 * float(r['token_hit_rate']):.2f}"
    if "ttft_p95_s" in r:
        text += f" / {float(r['ttft_p95_s']):.2f}"
    return text


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display), imported when first
    needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_hit_rates(records: Sequence[Record], out_dir: Path) -> list[Path]:
    plt = pyplot()
    groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in _ok(records):
        groups[(trace_name(r), str(r["mode"]))].append(r)
    paths = []
    for (trace, mode), recs in sorted(groups.items()):
        fig, ax = plt.subplots(figsize=(6, 4))
        for policy in _policies(recs):
            pts = sorted(
                (float(r["cache_gb"]), 100 * float(r["token_hit_rate"]))
                for r in recs
                if r["policy"] == policy
            )
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
        ax.set(xlabel="cache size (GB)", ylabel="token hit rate (%)", title=f"{trace} ({mode})")
        ax.grid(alpha=0.3)
        ax.legend()
        paths.append(save_png(fig, out_dir / f"hitrate-{trace}-{mode}.png"))
    return paths


def _engine_groups(records: Sequence[Record]) -> dict[tuple[str, float], list[Record]]:
    groups: dict[tuple[str, float], list[Record]] = defaultdict(list)
    for r in _ok(records):
        if "ttft_cdf_s" in r:
            groups[(trace_name(r), float(r["cache_gb"]))].append(r)
    return groups


def plot_ttft_cdf(records: Sequence[Record], out_dir: Path) -> list[Path]:
    plt = pyplot()
    paths = []
    for (trace, gb), recs in sorted(_engine_groups(records).items()):
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in recs:
            qs = r["ttft_cdf_s"]
            ax.plot(qs, [i / (len(qs) - 1) for i in range(len(qs))], label=str(r["policy"]))
        ax.set(
            xscale="log",
            xlabel="TTFT (s)",
            ylabel="fraction of requests",
            title=f"TTFT CDF: {trace}, {gb:g} GB",
        )
        ax.grid(alpha=0.3)
        ax.legend()
        paths.append(save_png(fig, out_dir / f"ttft-cdf-{trace}-{gb:g}GB.png"))
    return paths


def plot_memory_timeline(records: Sequence[Record], out_dir: Path) -> list[Path]:
    plt = pyplot()
    paths = []
    for (trace, gb), recs in sorted(_engine_groups(records).items()):
        fig, axes = plt.subplots(len(recs), 1, figsize=(7, 2.6 * len(recs)), squeeze=False)
        for ax, r in zip(axes[:, 0], recs, strict=True):
            tl = r["timeline"]
            layers = [[b / 1e9 for b in tl[k]] for k in ("used", "evictable", "free", "wasted")]
            ax.stackplot(tl["t"], *layers, labels=["used", "evictable", "free", "wasted"])
            ax.set(ylabel="GB", title=f"{r['policy']}")
            twin = ax.twinx()
            twin.plot(tl["t"], tl["decode_batch"], color="black", lw=0.8, label="decode batch")
            twin.set_ylabel("decode batch")
            ax.legend(loc="upper left", fontsize=7)
        axes[-1, 0].set_xlabel("simulated time (s)")
        fig.suptitle(f"memory over time: {trace}, {gb:g} GB")
        paths.append(save_png(fig, out_dir / f"memory-{trace}-{gb:g}GB.png"))
    return paths


def save_png(fig: Any, path: Path) -> Path:
    """Write `fig` to `path` (folders made) and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def write_report(records: Sequence[Record], out_dir: str | Path) -> tuple[str, list[Path]]:
    """Write report.md and every plot under `out_dir`; returns the table and the PNG paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(records)
    (out / "report.md").write_text(table, encoding="utf-8")
    pngs = plot_hit_rates(records, out) + plot_ttft_cdf(records, out)
    pngs += plot_memory_timeline(records, out)
    return table, pngs
