"""`make e2e-cpu`: the tiny hybrid model served by SGLang on CPU, stock and with --enable-jenga.

For each variant: start `python -m sglang.launch_server` on loopback (bench/drivers/server.py),
replay a few sessions of a small agent trace with the multi-turn chat client
(bench/studies/online.py), run the frontend `fork` program (bench/drivers/frontend_fork.py), then a
shared-system-prompt chat load at concurrency 8 ("chat8": single-turn requests = one system prompt +
a fresh question), stop the server. Prints one JSON summary per variant: cached tokens and mean TTFT
per turn, the fork branches' cached tokens, the chat load's cached tokens and TTFT, the prefill
rounds SGLang ran for each workload (its "Prefill batch" log lines), and whether the greedy
outputs were identical.

Variants: `stock` (no flag), `jenga` (`--enable-jenga`), and on request `jenga-cut`
(`--enable-jenga --jenga-capture cut`: the chunk ends at each planned checkpoint instead of the
forward capturing it in-pass; one more prefill round per checkpoint).

    jenga-bench e2e-cpu [--model data/tiny-model] [--variants ...]
        [--strategy no_buffer|extra_buffer]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jenga_sglang.bench.drivers.server import STRATEGIES, LocalServer, ServerError
from jenga_sglang.bench.studies.online import run_online
from jenga_sglang.bench.traces.agent import AgentParams
from jenga_sglang.bench.traces.build import cached_trace
from jenga_sglang.bench.traces.synthetic import SystemChatParams
from jenga_sglang.bench.traces.turns import OnlineConfig

VARIANTS: dict[str, tuple[str, ...]] = {
    "stock": (),
    "jenga": ("--enable-jenga",),
    "jenga-cut": ("--enable-jenga", "--jenga-capture", "cut"),
}
DEFAULT_VARIANTS = ("stock", "jenga")
#: The shared-system-prompt chat load: 24 requests, 8 at a time, a 150-word system prompt.
CHAT8 = SystemChatParams(
    requests=24, prompts=1, system_len=(150, 150), user_len=(20, 40), output_len=(8, 8), seed=0
)


def chat8_config(config: OnlineConfig, url: str) -> OnlineConfig:
    """The chat load's client: all 24 requests, 8 at a time, the whole prompt as words."""
    return dataclasses.replace(config, url=url, max_requests=24, concurrency=8, max_user_words=200)


def small_agent_trace(cache_dir: Path, sessions: int = 2) -> Path:
    """A few SWE-agent-style sessions (the client turns ids into words: online_turns.py)."""
    return cached_trace("agent", AgentParams(sessions=sessions, seed=0), cache_dir)


def prefill_rounds(log_text: str) -> int:
    """Prefill rounds SGLang ran: one "Prefill batch" line per prefill forward."""
    return log_text.count("Prefill batch")


def serve_and_measure(
    model: str,
    flags: Sequence[str],
    traces: dict[str, Path],
    config: OnlineConfig,
    log: Path,
    strategy: str = "no_buffer",
) -> dict[str, Any]:
    """One server: the multi-turn replay, the fork program, the chat load; the prefill
    rounds of each, from the part of the server's log it wrote."""
    from jenga_sglang.bench.drivers.frontend_fork import run_fork

    rounds: dict[str, int] = {}
    with LocalServer(model, flags, log=log, strategy=strategy) as server:
        url = server.url
        workloads: dict[str, Any] = {
            "agent": lambda: run_online(str(traces["agent"]), dataclasses.replace(config, url=url)),
            "fork": lambda: run_fork(url),
            "chat8": lambda: run_online(str(traces["chat8"]), chat8_config(config, url)),
        }
        results = {}
        for name, run in workloads.items():
            start = log.stat().st_size
            results[name] = run()
            with log.open("rb") as f:
                f.seek(start)
                rounds[name] = prefill_rounds(f.read().decode(errors="replace"))
    return {
        "replay": results["agent"],
        "fork": results["fork"],
        "chat8": results["chat8"],
        "prefill_rounds": rounds,
    }


def _brief(run: dict[str, Any]) -> dict[str, Any]:
    replay = run["replay"]
    return {
        "requests": replay["requests"],
        "errors": replay["errors"],
        "error_kinds": replay["error_kinds"],
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
        "prefill_rounds": run["prefill_rounds"],
        "chat8": {
            "requests": run["chat8"]["requests"],
            "errors": run["chat8"]["errors"],
            "error_kinds": run["chat8"]["error_kinds"],
            "prompt_tokens": run["chat8"]["prompt_tokens"],
            "cached_tokens": run["chat8"]["cached_tokens"],
            "mean_ttft_s": _round(run["chat8"]["mean_ttft_s"]),
            "p50_ttft_s": _round(run["chat8"]["p50_ttft_s"]),
            "outputs_sha256": run["chat8"]["outputs_sha256"],
        },
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run_e2e(
    model: str,
    out_dir: Path,
    config: OnlineConfig,
    sessions: int,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    strategy: str = "no_buffer",
    server_flags: Sequence[str] = (),
) -> dict[str, Any]:
    """Each variant served with its flags after `server_flags` (the same for every server)."""
    traces = {
        "agent": small_agent_trace(out_dir / "traces", sessions),
        "chat8": cached_trace("system-chat", CHAT8, out_dir / "traces"),
    }
    runs = {
        name: serve_and_measure(
            model,
            (*server_flags, *VARIANTS[name]),
            traces,
            config,
            out_dir / f"server-{name}.log",
            strategy,
        )
        for name in variants
    }
    briefs = {name: _brief(run) for name, run in runs.items()}
    same = len({b["outputs_sha256"] for b in briefs.values()}) == 1
    same_fork = len({tuple(b["fork_answers"]) for b in briefs.values()}) == 1
    same_chat = len({b["chat8"]["outputs_sha256"] for b in briefs.values()}) == 1
    return {
        "model": model,
        "traces": {name: str(path) for name, path in traces.items()},
        "strategy": strategy,
        "server_flags": list(server_flags),
        "identical_outputs": same and same_fork,
        # Eight concurrent requests batch differently on each server; see docs/e2e-cpu.md.
        "identical_outputs_chat8": same_chat,
        **briefs,
    }


def add_replay_args(
    parser: argparse.ArgumentParser,
    *,
    out: str,
    sessions: int,
    max_requests: int,
    concurrency: int,
    max_seconds: float,
) -> None:
    """The flags of a study that serves the tiny model and replays agent sessions: the model,
    the output folder, the trace's sessions and the replay client's bounds (`replay_setup`)."""
    parser.add_argument("--model", default="data/tiny-model", help="model directory")
    parser.add_argument("--out", default=out, help="logs, trace and summary go here")
    parser.add_argument("--sessions", type=int, default=sessions, help="agent sessions to build")
    parser.add_argument(
        "--max-requests", type=int, default=max_requests, help="replayed requests per server"
    )
    parser.add_argument("--concurrency", type=int, default=concurrency, help="sessions at a time")
    parser.add_argument("--max-output-tokens", type=int, default=8, help="reply tokens at most")
    parser.add_argument("--max-user-words", type=int, default=40, help="words per user message")
    parser.add_argument("--max-seconds", type=float, default=max_seconds, help="replay time budget")


def replay_setup(
    prog: str, args: argparse.Namespace, known: Sequence[str], **client: Any
) -> tuple[list[str], OnlineConfig] | None:
    """The `--variants` asked for (of `known`) and the replay client's settings (`client`: more
    `OnlineConfig` fields); None, with the reason on stderr, when the model is missing or a
    setting is bad."""
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in known]
    try:
        if not (Path(args.model) / "config.json").exists():
            raise ValueError(f"no model at {args.model} (run `make tiny-model`)")
        if unknown or not variants:
            raise ValueError(f"unknown variants {unknown}; pick of {', '.join(known)}")
        config = OnlineConfig(
            url="http://127.0.0.1",  # replaced by each server's URL
            max_requests=args.max_requests,
            max_seconds=args.max_seconds,
            concurrency=args.concurrency,
            max_user_words=args.max_user_words,
            max_output_tokens=args.max_output_tokens,
            **client,
        )
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return None
    return variants, config


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="e2e-cpu", description=__doc__.splitlines()[0])
    add_replay_args(
        parser, out="out/e2e", sessions=2, max_requests=8, concurrency=2, max_seconds=400.0
    )
    parser.add_argument(
        "--strategy",
        choices=sorted(STRATEGIES),
        default="no_buffer",
        help="Mamba cache strategy: no_buffer (no overlap) or extra_buffer (overlap scheduling)",
    )
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"servers to run, comma-separated, of {', '.join(VARIANTS)}",
    )
    parser.add_argument(
        "--server-flags",
        default="",
        help="more SGLang flags for every server, e.g. "
        "--server-flags=--enable-int8-mamba-checkpoint",
    )
    args = parser.parse_args(argv)
    setup = replay_setup("e2e-cpu", args, tuple(VARIANTS))
    if setup is None:
        return 2
    variants, config = setup
    out = Path(args.out)
    try:
        flags = shlex.split(args.server_flags)
        summary = run_e2e(args.model, out, config, args.sessions, variants, args.strategy, flags)
    except ServerError as exc:
        print(f"e2e-cpu: error: {exc}", file=sys.stderr)
        return 1
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    failed = any(summary[name]["errors"] or summary[name]["chat8"]["errors"] for name in variants)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
