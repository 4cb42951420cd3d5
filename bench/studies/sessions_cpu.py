"""`make sessions-cpu`: SGLang's session radix cache against our agent path, on CPU.

    python -m jenga_sglang.bench.studies.sessions_cpu [--sessions 8] [--max-requests 40]
        [--concurrency 4] [--max-total-tokens 4096] [--server-flags '...'] [--out out/sessions]

SGLang's session radix cache pins each open session's last paths in the tree until the session
closes; our tree keeps every prompt end's state anyway (`--jenga-prompt-end`), weighed by the
eviction policy, and serves the flag too (binding/cache/sessions.py: the same pins in our tree).
This study measures them on the load the flag is for. Five servers of the tiny NemotronH, one
after another, get the same agent replay from the same client, every conversation an SGLang
session (`jenga-bench online --radix-sessions`: opened before its first turn, named in every
request, closed after its last): stock SGLang, stock with `--enable-session-radix-cache`,
`--enable-jenga` without and with it, and `--enable-jenga --no-jenga-pool` (our tree on
SGLang's own pools, to tell the tree's part from the pool's). A server without the session flag
serves session-named requests as any other. All run with the same `--max-total-tokens`, so
that the concurrent sessions' histories outgrow SGLang's KV share and eviction decides what
the next turn finds. The Jenga pool's byte budget is SGLang's static split of the same flags
(KV tokens plus Mamba states), which it shares between the two: with SGLang's CPU sizing most
of those bytes are states, so over the pool KV can hold more tokens than `--max-total-tokens`.
`--variants` also takes servers outside the default five: our host tier (`jenga-host`), and
stock SGLang's HiCache with the same host bytes (`stock-hicache`, through the CPU test shim
jenga_sglang/cpu_hicache.py), among others (`VARIANTS`).

Reported per server: requests and errors, prompt and cached tokens (the usage reports), mean
TTFT, prefill rounds (its log), whether the greedy replies equal the first server's, and both
servers' cached ratio and mean TTFT over the turns both served with equal prompts (a server
that refuses a turn ends that session there, so totals can cover different turns); each
server's served turns go to `replies-<variant>.json` beside `summary.json`, one row
[session, turn, reply, prompt tokens, cached tokens, TTFT s] each, to trace a difference.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from jenga_sglang.bench.drivers.server import LocalServer, ServerError, scrape_counters
from jenga_sglang.bench.studies.e2e_cpu import (
    add_replay_args,
    prefill_rounds,
    replay_setup,
    small_agent_trace,
)
from jenga_sglang.bench.studies.online import run_online
from jenga_sglang.bench.traces.turns import OnlineConfig

VARIANTS: dict[str, tuple[str, ...]] = {
    "stock": (),
    "stock-sessions": ("--enable-session-radix-cache",),
    "jenga": ("--enable-jenga",),
    "jenga-sessions": ("--enable-jenga", "--enable-session-radix-cache"),
    # our tree on SGLang's own pools: the tree's part of the difference, without the Jenga
    # pool's (which lends KV the bytes SGLang's static split gives Mamba states)
    "jenga-no-pool": ("--enable-jenga", "--no-jenga-pool"),
    # not in the default set: the same on LRU eviction (bench/RESULTS.md "Serving: sessions")
    "jenga-no-pool-lru": ("--enable-jenga", "--no-jenga-pool", "--jenga-eviction", "lru"),
    # the live host tier (binding/host/, issue #29), weighed at this CPU's rates: memcpy at
    # about 5 GB/s, and the tiny model's prefill (0.2-0.3 MFLOP a token) at 35-80 tokens/s
    # under the interpreter: about 1e-5 TFLOP/s
    "jenga-host": (
        "--enable-jenga",
        "--jenga-host-gb",
        "1",
        "--jenga-host-bw",
        "5",
        "--jenga-prefill-tflops",
        "0.00001",
        "--enable-metrics",
    ),
    # stock SGLang's HiCache, live on CPU through our test shim (jenga_sglang/cpu_hicache.py:
    # no pinning, its direct copies in torch), with jenga-host's 1 GB of host memory, which
    # SGLang splits between its host KV and Mamba pools in proportion to the device pools
    "stock-hicache": (
        "--enable-hierarchical-cache",
        "--hicache-size",
        "1",
        "--hicache-io-backend",
        "direct",
        "--hicache-mem-layout",
        "page_first_direct",
        "--enable-metrics",
    ),
}
#: What `host_metrics` reads, by the key it reports: our tier's counters, and the prompt
#: tokens SGLang itself reports as served from host (its per-request cache breakdown, filled
#: for HiCache's load-backs and for ours, which go through the same `init_load_back`).
HOST_COUNTERS = {
    **{
        name: f"jenga:{name}"
        for name in (
            "host_hit_tokens_total",
            "host_stored_bytes_total",
            "host_loaded_bytes_total",
            "host_kept_bytes_total",
            "host_loads_declined_total",
            "hit_tokens_total",
        )
    },
    "sglang_host_cached_tokens": 'sglang:cached_tokens_total{cache_source="host"}',
}
DEFAULT_VARIANTS = ("stock", "stock-sessions", "jenga", "jenga-sessions", "jenga-no-pool")


class Turn(NamedTuple):
    """One served turn: its reply, and what the usage report and the stream measured."""

    text: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float = 0.0


Replies = dict[tuple[int, int], Turn]  # a run's served turns by (session, turn)


def serve_sessions(
    model: str, flags: Sequence[str], trace: Path, config: OnlineConfig, log: Path
) -> tuple[dict[str, Any], Replies]:
    """One server: the session replay's summary (without per-request records) and rounds,
    and its served turns by (session, turn), for `same_replies` and `on_common_turns`."""
    with LocalServer(model, flags, log=log) as server:
        summary = run_online(str(trace), dataclasses.replace(config, url=server.url))
        tier = host_metrics(server.url) if "--enable-metrics" in flags else {}
    brief = {k: v for k, v in summary.items() if k not in ("records", "per_turn")}
    brief.update(tier)
    brief["prefill_rounds"] = prefill_rounds(log.read_text(errors="replace"))
    ok = (r for r in summary["records"] if r["error"] is None)
    return brief, {
        (r["session_id"], r["turn_index"]): Turn(
            r["text"], r["prompt_tokens"], r["cached_tokens"], r["ttft_s"] or 0.0
        )
        for r in ok
    }


def same_replies(first: Replies, other: Replies) -> str:
    """'equal/common': replies equal on the (session, turn) pairs both servers served. With
    several sessions in flight the request budget runs out in whichever session timing
    picks, so two servers' sets of requests may differ by a turn or two, and a hash over all
    replies would then differ with every common reply equal."""
    common = first.keys() & other.keys()
    return f"{sum(first[k].text == other[k].text for k in common)}/{len(common)}"


def on_common_turns(first: Replies, other: Replies) -> dict[str, float]:
    """Cached ratio and mean TTFT of both servers over the turns both served with equal
    prompts: a server that refuses a turn (over its input limit) ends that session there, so
    its totals cover fewer and shorter prompts than one that serves it."""
    common = [k for k in first.keys() & other.keys() if first[k].prompt_tokens]
    common = [k for k in common if first[k].prompt_tokens == other[k].prompt_tokens]
    out: dict[str, float] = {"turns": len(common)}
    for side, turns in (("first", first), ("this", other)):
        prompt = sum(turns[k].prompt_tokens for k in common)
        out[f"{side}_cached_ratio"] = sum(turns[k].cached_tokens for k in common) / max(1, prompt)
        out[f"{side}_mean_ttft_s"] = sum(turns[k].ttft_s for k in common) / max(1, len(common))
    return out


def host_metrics(url: str) -> dict[str, float]:
    """The host tier's counters from the server's /metrics (binding/cache/metrics.py), summed
    over ranks: hit tokens loaded from host, bytes stored and loaded, load-backs declined for
    the checkpoint's room (binding/pools/budget.py `fits_loaded_state`), and all hit tokens."""
    return scrape_counters(url, HOST_COUNTERS)


def run_study(
    model: str,
    out: Path,
    config: OnlineConfig,
    sessions: int,
    max_total_tokens: int,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    server_flags: Sequence[str] = (),
) -> dict[str, Any]:
    trace = small_agent_trace(out / "traces", sessions)
    budget = ("--max-total-tokens", str(max_total_tokens), *server_flags)
    served = {
        name: serve_sessions(
            model, (*budget, *VARIANTS[name]), trace, config, out / f"server-{name}.log"
        )
        for name in variants
    }
    first = served[variants[0]][1]
    runs = {}
    for name, (brief, replies) in served.items():
        brief[f"same_replies_as_{variants[0]}"] = same_replies(first, replies)
        if name != variants[0]:
            brief[f"common_turns_with_{variants[0]}"] = on_common_turns(first, replies)
        runs[name] = brief
        kept = [[session, turn, *t] for (session, turn), t in sorted(replies.items())]
        (out / f"replies-{name}.json").write_text(json.dumps(kept) + "\n")  # to trace a diff
    return {
        "model": model,
        "trace": str(trace),
        "max_total_tokens": max_total_tokens,
        "server_flags": list(server_flags),
        "client": {k: v for k, v in dataclasses.asdict(config).items() if k != "url"},
        **runs,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sessions-cpu", description=__doc__.splitlines()[0])
    add_replay_args(
        parser, out="out/sessions", sessions=8, max_requests=40, concurrency=4, max_seconds=600.0
    )
    parser.add_argument(
        "--max-total-tokens", type=int, default=4096, help="KV budget of every server, tokens"
    )
    parser.add_argument(
        "--server-flags",
        default="",
        help="more SGLang flags for every server alike, e.g. "
        "--server-flags='--max-mamba-cache-size 24'",
    )
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"servers, comma-separated, of {', '.join(VARIANTS)} (replies compare to the first)",
    )
    args = parser.parse_args(argv)
    setup = replay_setup("sessions-cpu", args, tuple(VARIANTS), radix_sessions=True)
    if setup is None:
        return 2
    variants, config = setup
    out = Path(args.out)
    try:
        summary = run_study(
            args.model,
            out,
            config,
            args.sessions,
            args.max_total_tokens,
            variants,
            shlex.split(args.server_flags),
        )
    except ServerError as exc:
        print(f"sessions-cpu: error: {exc}", file=sys.stderr)
        return 1
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 1 if any(summary[name]["errors"] for name in variants) else 0


if __name__ == "__main__":
    raise SystemExit(main())
