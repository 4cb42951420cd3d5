"""`jenga-bench scale-tp`: the tiny hybrid model served with `--tp-size 2` on CPU, stock and
`--enable-jenga`, with SGLang's rank-consensus checker on (docs/sglang.md, "Tensor and data
parallelism"; bench/RESULTS.md, "Scale-out").

    jenga-bench scale-tp [--variants stock,jenga[,jenga-host]] [--out out/scale-tp]

Each server runs two TP ranks (``SGLANG_CPU_OMP_THREADS_BIND=0|1``, one core each; pynccl off
by the CPU test shim, jenga_sglang/cpu_tensor_parallel.py) with
``SGLANG_ENABLE_RANK_CONSENSUS_CHECKER=1``; Jenga's pool is small, so decode outgrows it and
SGLang retracts requests (stock keeps its default pool: `VARIANT_FLAGS`). The same load goes
to each, bounded in count and time:

1. faults: six concurrent streams of long replies (`FAULT_REPLY` tokens), the third cancelled
   after 3 chunks, on the empty tree (so all six are admitted and decode outgrows the pool);
2. multi-turn: ``SESSIONS`` sessions of ``TURNS`` greedy /generate turns, each turn's prompt
   the previous prompt, its reply and new ids (concurrent sessions);
3. revisit: ``FILLERS`` unrelated long prompts push the sessions out of Jenga's pool (with
   the host tier, to host memory), then each session's next turn (a host hit to load back);
4. a last request after an idle pause (SGLang's leak check runs on idle loops).

Reported per variant: replies of phases 2 and 3 (compared across variants: greedy outputs
must be identical), cached tokens per turn, the host tier's counters (`jenga-host`), whether
the checker was on and stayed quiet (its "Found rank divergence" line ends the scheduler),
retractions, the Jenga pool lines of both ranks (equal), tracebacks, and whether the server
was healthy at the end.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from jenga_sglang.bench.drivers.faults import (
    generate,
    health,
    stream_generate,
    unexpected_tracebacks,
)
from jenga_sglang.bench.drivers.server import LocalServer
from jenga_sglang.bench.studies.sessions_cpu import host_metrics

TP_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER": "1"}
COMMON = ("--max-mamba-cache-size", "32", "--max-running-requests", "6")
#: Jenga's pool over SGLang's static split of 128 KV tokens and 32 states holds about 2,000 KV
#: tokens at TP 2, which the faults phase outgrows (admission on a low decode estimate), so
#: SGLang retracts; stock keeps the CPU default of 4,096 KV tokens (128 would refuse its
#: prompts), so it serves the same load without pressure.
_JENGA = (
    *COMMON, "--enable-jenga", "--max-total-tokens", "128", "--schedule-conservativeness", "0.05",
)  # fmt: skip
VARIANT_FLAGS: dict[str, tuple[str, ...]] = {
    "stock": COMMON,
    "jenga": _JENGA,
    # not in the default set: the same with the host tier at this CPU's rates (as the sessions
    # study's jenga-host), each rank demoting and loading its shard in lockstep
    "jenga-host": (
        *_JENGA, "--jenga-host-gb", "1", "--jenga-host-bw", "5",
        "--jenga-prefill-tflops", "0.00001", "--enable-metrics",
    ),
}  # fmt: skip
SESSIONS, TURNS, REPLY = 3, 3, 6
FILLERS, FILLER_LEN = 4, 400  # 1,600 tokens: most of Jenga's ~2,000, none of the sessions'
FAULT_REPLY = 360  # six 40-token prompts decoding this far outgrow Jenga's ~2,000 KV tokens
POOL_LINE = re.compile(r"TP(\d)\] Jenga pool: (.*)")


def _head(session: int) -> list[int]:
    shared = [11 + (5 * j) % 97 for j in range(24)]  # every session's common head
    return shared + [120 + (17 * session + 3 * j) % 300 for j in range(16)]


def multi_turn(url: str) -> list[dict[str, Any]]:
    """Phase 2: concurrent sessions, each turn extending the last prompt and reply."""

    def session(s: int) -> list[dict[str, Any]]:
        prompt, turns = _head(s), []
        for t in range(TURNS):
            turns.append(_turn(url, prompt, s, t))
            prompt = _next_prompt(prompt, turns[-1])
        return turns

    with ThreadPoolExecutor(SESSIONS) as pool:
        done = [f.result(timeout=900) for f in [pool.submit(session, s) for s in range(SESSIONS)]]
    return [turn for turns in done for turn in turns]


def _next_prompt(prompt: list[int], turn: dict[str, Any]) -> list[int]:
    """The session's next prompt: this turn's prompt, its reply and two new ids."""
    s, t = turn["session"], turn["turn"]
    reply: list[int] = turn["output"]
    return prompt + reply + [400 + 7 * s + t, 401 + t]


def _turn(url: str, prompt: list[int], s: int, t: int) -> dict[str, Any]:
    status, body = generate(url, prompt, REPLY, timeout_s=300)
    if status != 200:
        raise RuntimeError(f"session {s} turn {t}: HTTP {status}: {body}")
    cached = int(body["meta_info"].get("cached_tokens", 0))
    output = [int(x) for x in body.get("output_ids") or []]
    return {"session": s, "turn": t, "prompt": len(prompt), "text": body["text"],
            "cached": cached, "output": output}  # fmt: skip


def revisit(url: str, turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Phase 3: unrelated long prompts one after another, then each session's next turn
    (its last prompt, reply and new ids), one at a time."""
    for k in range(FILLERS):
        filler = [1 + (31 * k + 7 * j) % 500 for j in range(FILLER_LEN)]  # tiny vocab: 512
        status, body = generate(url, filler, 2, timeout_s=300)
        if status != 200:
            raise RuntimeError(f"filler {k}: HTTP {status}: {body}")
    out = []
    for s in range(SESSIONS):
        prompt = _head(s)
        for turn in sorted((x for x in turns if x["session"] == s), key=lambda x: x["turn"]):
            prompt = _next_prompt(prompt, turn)  # as phase 2 built them
        out.append(_turn(url, prompt, s, TURNS))
    return out


def fault_streams(url: str) -> dict[str, Any]:
    """Phase 1: six concurrent streams of long replies, one cancelled (pool pressure)."""
    with ThreadPoolExecutor(6) as pool:
        futures = [
            pool.submit(
                stream_generate, url, _head(10 + i), FAULT_REPLY,
                cancel_after=3 if i == 2 else None, timeout_s=600,
            )
            for i in range(6)
        ]  # fmt: skip
        results = [f.result(timeout=720) for f in futures]
    return {
        "streams_ok": sum(r.status == 200 and not r.cancelled for r in results),
        "cancelled": sum(r.cancelled for r in results),
    }


def last_request(url: str) -> dict[str, Any]:
    """Phase 3: idle (SGLang's leak check runs on idle loops), then one more request."""
    time.sleep(8)
    status, body = generate(url, _head(20), 4, timeout_s=300)
    return {
        "last_request": status,
        "last_cached": int(body.get("meta_info", {}).get("cached_tokens", 0)),
        "healthy": health(url),
    }


def read_log(text: str) -> dict[str, Any]:
    pools = dict(POOL_LINE.findall(text))
    return {
        "checker_on": "Rank consensus checker is enabled" in text,
        "divergences": text.count("Found rank divergence"),
        "retractions": text.count("Retract requests"),
        "pool_lines": pools,
        "pools_equal": len(set(pools.values())) <= 1,
        "tracebacks": unexpected_tracebacks(text),
        "leaks": text.lower().count("leak"),
    }


def run_variant(model: str, variant: str, out: Path) -> dict[str, Any]:
    log = out / f"{variant}.log"
    flags = ("--tp-size", "2", *VARIANT_FLAGS[variant])
    start = time.monotonic()
    with LocalServer(model, flags, log=log, ready_timeout_s=600, env=TP_ENV) as server:
        streams = fault_streams(server.url)  # first: on an empty tree all six are admitted
        turns = multi_turn(server.url)
        back = revisit(server.url, turns)
        probe = {**streams, **last_request(server.url)}
        tier = host_metrics(server.url) if "--enable-metrics" in flags else {}
    record = {
        "variant": variant,
        "turns": turns + back,
        "revisit_cached": [t["cached"] for t in back],
        **tier,
        **probe,
        **read_log(log.read_text(errors="replace")),
    }
    record["wall_s"] = round(time.monotonic() - start, 1)
    return record


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    texts = {r["variant"]: [t["text"] for t in r["turns"]] for r in records}
    first = next(iter(texts.values()), [])
    return {
        "outputs_identical": all(t == first for t in texts.values()),
        "cached_tokens": {r["variant"]: sum(t["cached"] for t in r["turns"]) for r in records},
        "revisit_cached": {r["variant"]: r["revisit_cached"] for r in records},
        "quiet": all(r["checker_on"] and r["divergences"] == 0 for r in records),
        "records": records,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jenga-bench scale-tp", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="data/tiny-model")
    p.add_argument(
        "--variants", default="stock,jenga", help=f"comma-separated, of {', '.join(VARIANT_FLAGS)}"
    )
    p.add_argument("--out", default="out/scale-tp")
    args = p.parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v not in VARIANT_FLAGS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANT_FLAGS)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server on the way out
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = [run_variant(args.model, v, out) for v in args.variants.split(",")]
    summary = summarize(records)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "records"}))
    ok = summary["outputs_identical"] and summary["quiet"]
    return 0 if ok and all(r["healthy"] and r["tracebacks"] == 0 for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
