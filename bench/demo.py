"""`make demo`: build two traces, sweep a small grid, print the table, write the plots.

1. a ShareGPT multi-turn trace at 1 session/s (120 sessions) and a SWE-agent-structured agent
   trace (cached under data/traces/, so a second demo skips building);
2. sequential replay of both: cache 1, 2, 5 GB x jenga, marconi, sglang-lru, vllm-blocks on
   marconi-7b, in parallel over all cores;
3. engine replay of the agent trace at 2 GB for the four policies (TTFT CDF, memory timeline);
4. the markdown table on stdout; report.md, records.jsonl and the PNGs in out/demo/.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from jenga_sglang.bench.agent import AgentParams
from jenga_sglang.bench.sharegpt import ShareGPTParams
from jenga_sglang.bench.traces_cli import cached_trace

POLICIES = ("jenga", "marconi", "sglang-lru", "vllm-blocks")
CACHE_GB = (1.0, 2.0, 5.0)
ENGINE_GB = (2.0,)
MODEL = "marconi-7b"
# Small enough for "a few minutes on 2 cores": the first 120 ShareGPT sessions with 10+ rounds.
SHAREGPT = ShareGPTParams(rate=1.0, max_sessions=120)
AGENT = AgentParams(sessions=16, rate=0.5, max_turns=30)


def _say(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def run_demo(out_dir: str | Path = "out/demo") -> int:
    from jenga_sglang.bench.report import write_report
    from jenga_sglang.bench.sweep import grid, sweep

    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _say("building traces (cached in data/traces/)")
    traces = [
        str(cached_trace("sharegpt", SHAREGPT)),
        str(cached_trace("agent", AGENT)),
    ]
    _say(f"traces: {', '.join(traces)} ({time.perf_counter() - start:.0f} s)")
    configs = grid(traces, MODEL, CACHE_GB, POLICIES, mode="sequential")
    configs += grid(traces[1:], MODEL, ENGINE_GB, POLICIES, mode="engine")
    records = []
    with open(out / "records.jsonl", "w", encoding="utf-8") as f:
        for record in sweep(configs):
            records.append(record)
            f.write(json.dumps(record, separators=(",", ":")) + "\n")
    table, pngs = write_report(records, out)
    print(table)
    for path in pngs:
        print(f"wrote {path}")
    _say(f"done in {time.perf_counter() - start:.0f} s")
    return 1 if any("error" in r for r in records) else 0


def main() -> int:
    return run_demo()


if __name__ == "__main__":
    sys.exit(main())
