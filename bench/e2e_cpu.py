"""`make e2e-cpu`: the tiny hybrid model served by SGLang on CPU, stock and with --enable-jenga.

For each variant: start `python -m sglang.launch_server` on loopback (bench/server.py), replay a
few sessions of a small agent trace with the multi-turn chat client (bench/online.py), run the
frontend `fork` program (bench/frontend_fork.py), stop the server. Prints one JSON summary:
cached tokens and mean TTFT per turn for both variants, the fork branches' cached tokens, and
whether the greedy outputs were identical.

    .venv/bin/python -m jenga_sglang.bench.e2e_cpu [--model data/tiny-model] [--json]
        [--strategy no_buffer|extra_buffer]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jenga_sglang.bench.agent import AgentParams
from jenga_sglang.bench.online import OnlineConfig, run_online
from jenga_sglang.bench.server import STRATEGIES, LocalServer, ServerError
from jenga_sglang.bench.traces_cli import cached_trace

VARIANTS: dict[str, tuple[str, ...]] = {"stock": (), "jenga": ("--enable-jenga",)}


def small_agent_trace(cache_dir: Path, sessions: int = 2) -> Path:
    """A few SWE-agent-style sessions (the client turns ids into words; see bench/online.py)."""
    return cached_trace("agent", AgentParams(sessions=sessions, seed=0), cache_dir)


def serve_and_measure(
    model: str,
    flags: Sequence[str],
    trace: Path,
    config: OnlineConfig,
    log: Path,
    strategy: str = "no_buffer",
) -> dict[str, Any]:
    """One server: the multi-turn replay, then the fork program."""
    from jenga_sglang.bench.frontend_fork import run_fork

    with LocalServer(model, flags, log=log, strategy=strategy) as server:
        replay = run_online(str(trace), dataclasses.replace(config, url=server.url))
        fork = run_fork(server.url)
    return {"replay": replay, "fork": fork}


def _brief(run: dict[str, Any]) -> dict[str, Any]:
    replay = run["replay"]
    return {
        "requests": replay["requests"],
        "errors": replay["errors"],
        "cached_ratio": round(replay["cached_ratio"], 4),
        "cached_tokens_per_turn": [t["cached_tokens"] for t in replay["per_turn"]],
        "prompt_tokens_per_turn": [t["prompt_tokens"] for t in replay["per_turn"]],
        "mean_ttft_s_per_turn": [
            None if t["mean_ttft_s"] is None else round(t["mean_ttft_s"], 2)
            for t in replay["per_turn"]
        ],
        "outputs_sha256": replay["outputs_sha256"],
        "fork_cached_tokens": run["fork"]["cached_tokens"],
        "fork_prompt_tokens": run["fork"]["prompt_tokens"],
        "fork_answers": run["fork"]["answers"],
    }


def run_e2e(
    model: str, out_dir: Path, config: OnlineConfig, sessions: int, strategy: str = "no_buffer"
) -> dict[str, Any]:
    trace = small_agent_trace(out_dir / "traces", sessions)
    runs = {
        name: serve_and_measure(
            model, flags, trace, config, out_dir / f"server-{name}.log", strategy
        )
        for name, flags in VARIANTS.items()
    }
    briefs = {name: _brief(run) for name, run in runs.items()}
    same = len({b["outputs_sha256"] for b in briefs.values()}) == 1
    same_fork = len({tuple(b["fork_answers"]) for b in briefs.values()}) == 1
    return {
        "model": model,
        "strategy": strategy,
        "trace": str(trace),
        "identical_outputs": same and same_fork,
        **briefs,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="e2e-cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="data/tiny-model", help="model directory")
    parser.add_argument("--out", default="out/e2e", help="logs, trace and summary go here")
    parser.add_argument("--sessions", type=int, default=2, help="agent sessions to build")
    parser.add_argument("--max-requests", type=int, default=8, help="chat requests per server")
    parser.add_argument("--concurrency", type=int, default=2, help="sessions at a time")
    parser.add_argument("--max-output-tokens", type=int, default=8, help="reply tokens at most")
    parser.add_argument("--max-user-words", type=int, default=40, help="words per user message")
    parser.add_argument("--max-seconds", type=float, default=400.0, help="replay time budget")
    parser.add_argument(
        "--strategy",
        choices=sorted(STRATEGIES),
        default="no_buffer",
        help="Mamba cache strategy: no_buffer (no overlap) or extra_buffer (overlap scheduling)",
    )
    args = parser.parse_args(argv)
    if not (Path(args.model) / "config.json").exists():
        print(f"e2e-cpu: error: no model at {args.model} (run `make tiny-model`)", file=sys.stderr)
        return 2
    config = OnlineConfig(
        url="http://127.0.0.1",  # replaced by each server's URL
        max_requests=args.max_requests,
        max_seconds=args.max_seconds,
        concurrency=args.concurrency,
        max_user_words=args.max_user_words,
        max_output_tokens=args.max_output_tokens,
    )
    out = Path(args.out)
    try:
        summary = run_e2e(args.model, out, config, args.sessions, args.strategy)
    except ServerError as exc:
        print(f"e2e-cpu: error: {exc}", file=sys.stderr)
        return 1
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    failed = any(summary[name]["errors"] for name in VARIANTS)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
