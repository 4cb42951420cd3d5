"""`jenga-bench scale-dp`: two replicas of the tiny hybrid model behind smg's router, on CPU
(docs/sglang.md, "Tensor and data parallelism"; bench/RESULTS.md, "Scale-out").

    jenga-bench scale-dp [--variants stock,jenga] [--policies cache_aware,round_robin]
        [--sessions 8] [--max-requests 40] [--server-flags '--max-total-tokens 2048']
        [--router-flags '--balance-abs-threshold 1'] [--out out/scale-dp]

For each variant (stock SGLang, `--enable-jenga`) and router policy: two fresh SGLang workers in
gRPC mode (`--grpc-mode`, smg-grpc-servicer), each publishing its cache's KV events
(`--kv-events-config`, ZMQ) and pinned to one core, and `smg` in front of them
(bench/drivers/router.py). smg's `cache_aware` policy follows the events (event-driven: it
rebuilds each worker's cache from them and predicts a request's hit as the run of its leading
blocks the chosen worker holds); `round_robin` ignores them. Then `jenga-bench online`'s client
replays workloads through the router's URL: multi-turn chat (ShareGPT sessions) and an agent
trace, each turn carrying the whole history, and single-turn requests under two shared system
prompts (`SYSTEM_*`).

`--server-flags` go to every worker of every variant alike (a tight `--max-total-tokens` puts
the caches under memory pressure, where the variants differ on multi-turn loads), and
`--router-flags` to every router alike (smg's spill gate, `--balance-*-threshold`, decides when
`cache_aware` leaves the worker holding a prefix for a less loaded one).

Reported per run: requests, errors, prompt and cached tokens (the workers' usage reports),
mean TTFT, and for `cache_aware` the router's predicted hit tokens for the same requests (its
debug log, matched by request id), their sum against the workers' and the share of requests
predicted exactly. The client sends whichever session's next turn is ready, so runs may serve
different requests: `common_requests` compares each later run with the first over the turns
both served with equal prompts. Workers are restarted for every run so that no cache carries
over. Variants: `stock`, `jenga` (`--enable-jenga`) and `jenga-no-pool` (our tree over
SGLang's own pools, `--no-jenga-pool`).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from jenga_sglang.bench.drivers.router import POLICIES, LocalRouter
from jenga_sglang.bench.drivers.server import LocalServer, free_port
from jenga_sglang.bench.studies.online import run_online
from jenga_sglang.bench.studies.sessions_cpu import Turn, on_common_turns
from jenga_sglang.bench.traces.turns import OnlineConfig

VARIANT_FLAGS: dict[str, tuple[str, ...]] = {
    "stock": (),
    "jenga": ("--enable-jenga",),
    "jenga-no-pool": ("--enable-jenga", "--no-jenga-pool"),  # our tree over SGLang's pools
}
READY = "The server is fired up and ready to roll!"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ROUTED = re.compile(r'request_id="([^"]+)".*Event-driven routing.*overlap_blocks=(\d+)')
_BLOCK = re.compile(r"Learned block_size from KV event.*block_size=(\d+)")


#: Single-turn requests under two shared 150-word system prompts (24 requests, e2e-cpu's chat8
#: with two prompts): where stock SGLang keeps no state at the branch a router sees its KV.
SYSTEM_REQUESTS, SYSTEM_PROMPTS, SYSTEM_WORDS = 24, 2, 150
WORKLOADS = ("chat", "agent", "system")


def workload_traces(names: list[str], sessions: int, cache_dir: Path) -> dict[str, Path]:
    """Multi-turn chat (ShareGPT sessions of 10+ rounds), SWE-agent-style sessions, and the
    shared-system-prompt load (`SYSTEM_*`), those of `names`."""
    from jenga_sglang.bench.traces.agent import AgentParams
    from jenga_sglang.bench.traces.build import cached_trace
    from jenga_sglang.bench.traces.sharegpt import ShareGPTParams
    from jenga_sglang.bench.traces.synthetic import SystemChatParams

    build = {
        "chat": lambda: cached_trace("sharegpt", ShareGPTParams(max_sessions=sessions), cache_dir),
        "agent": lambda: cached_trace("agent", AgentParams(sessions=sessions, seed=0), cache_dir),
        "system": lambda: cached_trace(
            "system-chat",
            SystemChatParams(
                requests=SYSTEM_REQUESTS,
                prompts=SYSTEM_PROMPTS,
                system_len=(SYSTEM_WORDS, SYSTEM_WORDS),
                user_len=(20, 40),
                output_len=(8, 8),
                seed=0,
            ),
            cache_dir,
        ),
    }
    return {name: build[name]() for name in names}


def _worker(
    model: str, variant: str, core: int, log: Path, server_flags: Sequence[str] = ()
) -> LocalServer:
    events = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{free_port()}", "topic": "kv"})
    flags = ("--grpc-mode", "--kv-events-config", events, *server_flags, *VARIANT_FLAGS[variant])
    env = {"SGLANG_CPU_OMP_THREADS_BIND": str(core)}  # one core per replica
    # free_port's range keeps --port + 10000 a port, which legacy gRPC mode validates
    return LocalServer(model, flags, log=log, env=env, ready_line=READY, ready_timeout_s=600)


def predicted_hits(router_log: str) -> dict[str, int]:
    """Router-side request id -> hit tokens the event-driven policy predicted for it."""
    text = _ANSI.sub("", router_log)
    block = int(m.group(1)) if (m := _BLOCK.search(text)) else 1
    return {rid: int(blocks) * block for rid, blocks in _ROUTED.findall(text)}


def compare(records: list[dict[str, Any]], predicted: dict[str, int]) -> dict[str, Any]:
    """The router's predictions against what the workers reported, request by request. A
    request the router placed without its event index (its first requests, before any event
    arrived: smg's approximate tree then) counts as predicted 0."""
    pairs = []
    for r in records:
        if r.get("error"):
            continue
        match = next((p for rid, p in predicted.items() if r["response_id"].startswith(rid)), 0)
        pairs.append((match, int(r["cached_tokens"])))
    said, got = sum(p for p, _ in pairs), sum(c for _, c in pairs)
    return {
        "event_routed": sum(
            any(r["response_id"].startswith(rid) for rid in predicted) for r in records
        ),
        "predicted_tokens": said,
        "reported_cached_tokens": got,
        "predicted_over_reported": round(said / got, 3) if got else None,
        "exact_share": round(sum(p == c for p, c in pairs) / len(pairs), 3) if pairs else None,
    }


def client_config(max_requests: int, max_seconds: float) -> OnlineConfig:
    """`jenga-bench online`'s client settings for every run (the URL is the router's)."""
    return OnlineConfig(
        url="http://127.0.0.1:1",  # replaced by the router's
        max_requests=max_requests,
        max_seconds=max_seconds,
        concurrency=4,
        max_user_words=40,
        max_output_tokens=8,
    )


def _brief(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("requests", "errors", "error_kinds", "prompt_tokens", "cached_tokens", "mean_ttft_s")
    out = {k: summary[k] for k in keys}
    out["cached_ratio"] = round(summary["cached_ratio"], 4)
    return out


def run_one(
    model: str,
    variant: str,
    policy: str,
    traces: dict[str, Path],
    config: OnlineConfig,
    out: Path,
    server_flags: Sequence[str] = (),
    router_flags: Sequence[str] = (),
) -> dict[str, Any]:
    name = f"{variant}-{policy}"
    logs = [out / f"{name}-w{core}.log" for core in (0, 1)]
    workers = [_worker(model, variant, core, log, server_flags) for core, log in enumerate(logs)]
    with ExitStack() as stack:
        # Stops registered before the starts: a SIGTERM while the workers start (in threads,
        # both at once) stops them too, and a start in flight then ends on its own.
        for worker in workers:
            stack.callback(worker.stop)
        with ThreadPoolExecutor(2) as pool:
            starts = [pool.submit(w.__enter__) for w in workers]
        for start in starts:
            start.result()
        urls = [f"grpc://127.0.0.1:{w.port}" for w in workers]
        router_log = out / f"{name}-router.log"
        router = stack.enter_context(
            LocalRouter(urls, policy, model=model, log=router_log, extra_flags=router_flags)
        )
        result: dict[str, Any] = {"variant": variant, "policy": policy}
        result["server_flags"] = list(server_flags)
        result["router_flags"] = list(router_flags)
        for load, trace in traces.items():
            words = 200 if load == "system" else config.max_user_words  # the whole prompt
            summary = run_online(str(trace), replace(config, url=router.url, max_user_words=words))
            result[load] = _brief(summary)
            result[load]["turns"] = {
                f"{r['session_id']}/{r['turn_index']}": Turn(
                    r["text"], r["prompt_tokens"], r["cached_tokens"], r["ttft_s"] or 0.0
                )
                for r in summary["records"]
                if not r.get("error")
            }
            if policy == "cache_aware":
                hits = predicted_hits(router_log.read_text(errors="replace"))
                result[load]["router"] = compare(summary["records"], hits)
    return result


def _without_replies(result: dict[str, Any]) -> dict[str, Any]:
    return {
        k: {kk: vv for kk, vv in v.items() if kk != "turns"} if isinstance(v, dict) else v
        for k, v in result.items()
    }


def common_requests(results: list[dict[str, Any]], loads: list[str]) -> dict[str, Any]:
    """Per workload, each later run against the first over the requests both served with
    equal prompts (sessions_cpu's `on_common_turns`): a run's totals cover the requests its
    own timing let in, these are like for like."""
    if len(results) < 2:
        return {}
    first, *others = results
    return {
        load: {
            _name(run): on_common_turns(first[load]["turns"], run[load]["turns"]) for run in others
        }
        for load in loads
    }


def _name(run: dict[str, Any]) -> str:
    return f"{run['variant']}-{run['policy']}"


def identical_replies(results: list[dict[str, Any]], loads: list[str]) -> dict[str, list[int]]:
    """Per policy and workload: [requests both variants sent, of them with equal greedy replies]
    (the request budget is claimed by whichever session is ready, so the sets may differ)."""
    out: dict[str, list[int]] = {}
    for policy in {r["policy"] for r in results}:
        runs = [r for r in results if r["policy"] == policy]
        for load in loads:
            if len(runs) < 2:
                continue
            first, *others = (r[load]["turns"] for r in runs)
            common = set(first).intersection(*others)
            equal = sum(all(o[k].text == first[k].text for o in others) for k in common)
            out[f"{policy}/{load}"] = [len(common), equal]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jenga-bench scale-dp", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="data/tiny-model")
    p.add_argument("--variants", default="stock,jenga")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="of " + ",".join(WORKLOADS))
    p.add_argument("--sessions", type=int, default=8, help="sessions per workload")
    p.add_argument("--max-requests", type=int, default=40, help="requests per workload")
    p.add_argument("--max-seconds", type=float, default=400.0, help="per workload")
    p.add_argument("--out", default="out/scale-dp")
    p.add_argument(
        "--server-flags",
        default="",
        help="more SGLang flags for every worker, e.g. --server-flags='--max-total-tokens 2048'",
    )
    p.add_argument(
        "--router-flags",
        default="",
        help="more smg flags for every router, e.g. --router-flags='--balance-abs-threshold 1'",
    )
    args = p.parse_args(argv)
    server_flags, router_flags = shlex.split(args.server_flags), shlex.split(args.router_flags)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop servers on the way out
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    traces = workload_traces(args.workloads.split(","), args.sessions, Path("data/traces"))
    config = client_config(args.max_requests, args.max_seconds)
    start, results = time.monotonic(), []
    for variant in args.variants.split(","):
        for policy in args.policies.split(","):
            results.append(
                run_one(
                    args.model, variant, policy, traces, config, out, server_flags, router_flags
                )
            )
            print(json.dumps(_without_replies(results[-1])), flush=True)
    same, common = identical_replies(results, list(traces)), common_requests(results, list(traces))
    summary = {"runs": results, "identical": same, "common_requests": common}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({"identical_replies": same}))
    print(json.dumps({"common_requests": common}))
    print(json.dumps({"wall_s": round(time.monotonic() - start, 1)}))
    return 1 if any(r[w]["errors"] for r in results for w in traces) else 0


if __name__ == "__main__":
    raise SystemExit(main())
