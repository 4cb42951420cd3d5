"""`make demo`: build two traces, sweep a small grid, print the table, write the plots.

1. a ShareGPT multi-turn trace at 1 session/s (120 sessions), the SWE-agent-structured agent
   trace of bench/RESULTS.md (100 sessions) and a small one (16 sessions) that an engine
   serves without queueing for minutes (all cached under data/traces/, so a second demo skips
   building);
2. sequential replay: ShareGPT at 1, 2, 5 GB and the agent trace at 5, 10, 20 GB (its
   moderate contention) x jenga, marconi, sglang-lru, vllm-blocks on marconi-7b, in parallel
   over all cores;
3. engine replay of the small agent trace at 2 GB for the four policies (TTFT CDF, memory
   timeline);
4. the markdown table on stdout; report.md, records.jsonl and the PNGs in out/demo/;
5. the product itself (bench/studies/demo_serve.py): the tiny model served by SGLang on CPU,
   stock and with `--enable-jenga`, on a short shared-prefix load; cached tokens, prefill
   rounds and TTFT side by side (skipped with `--no-serve`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from jenga_sglang.bench.traces.agent import AgentParams
from jenga_sglang.bench.traces.build import cached_trace
from jenga_sglang.bench.traces.sharegpt import ShareGPTParams

POLICIES = ("jenga", "marconi", "sglang-lru", "vllm-blocks")
SHAREGPT_GB = (1.0, 2.0, 5.0)
AGENT_GB = (5.0, 10.0, 20.0)
ENGINE_GB = (2.0,)
MODEL = "marconi-7b"
# Small enough for "a few minutes on 2 cores": the first 120 ShareGPT sessions with 10+ rounds.
SHAREGPT = ShareGPTParams(rate=1.0, max_sessions=120)
AGENT = AgentParams()
# The full agent trace saturates the cost model's H100 (P95 TTFT of minutes): queueing would
# hide the cache in an engine replay, so that one serves a small trace.
AGENT_SMALL = AgentParams(sessions=16, rate=0.5, max_turns=30)


def _say(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def run_demo(out_dir: str | Path = "out/demo") -> int:
    from jenga_sglang.bench.runs.sweep import grid, sweep
    from jenga_sglang.bench.studies.report import write_report

    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _say("building traces (cached in data/traces/)")
    traces = [
        str(cached_trace("sharegpt", SHAREGPT)),
        str(cached_trace("agent", AGENT)),
        str(cached_trace("agent", AGENT_SMALL)),
    ]
    _say(f"traces: {', '.join(traces)} ({time.perf_counter() - start:.0f} s)")
    sharegpt, agent, agent_small = traces
    configs = grid([sharegpt], MODEL, SHAREGPT_GB, POLICIES, mode="sequential")
    configs += grid([agent], MODEL, AGENT_GB, POLICIES, mode="sequential")
    configs += grid([agent_small], MODEL, ENGINE_GB, POLICIES, mode="engine")
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
    status = run_demo()
    if "--no-serve" in sys.argv[1:]:
        return status
    from jenga_sglang.bench.studies.demo_serve import run_serve_demo

    _say("serving the tiny model: stock, then --enable-jenga")
    return status or run_serve_demo()


if __name__ == "__main__":
    sys.exit(main())
