"""`jenga-bench soak`: a timed load with aborts against a live server, and what it did over time.

    jenga-bench soak --minutes 3 --concurrency 8 --json out/soak.json          # starts a server
    jenga-bench soak --minutes 3 --url http://127.0.0.1:30000 --server-pid PID  # attaches

Workers (`--concurrency`) stream /generate requests back to back until the time is up: prompts
share one of a few system heads (so the cache has something to serve) and end in a tail of their
own; every `--abort-every`-th request is cancelled after 2 chunks (the client closes the
connection, which SGLang sees as an abort). Reported: requests, completed, cancelled, errors
(any non-200 or failure of a non-cancelled request), cached tokens, TTFT p50/p90/p99, and the
server's resident memory (all processes of its process group, from /proc) sampled every
`--sample-s`; with a server of its own, also whether its log reported a leak or a traceback.
Progress: one line on stderr, rewritten every few seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jenga_sglang.bench.drivers.faults import (
    StreamResult,
    health,
    stream_generate,
    unexpected_tracebacks,
)

HEADS, HEAD_LEN, TAIL_LEN, VOCAB = 4, 120, 24, 512


@dataclass
class _Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    results: list[StreamResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, result: StreamResult | None, error: str | None) -> None:
        with self.lock:
            if result is not None:
                self.results.append(result)
            if error is not None:
                self.errors.append(error)


def group_rss_mb(leader_pid: int) -> float:
    """Resident memory of every process in `leader_pid`'s process group, in MiB (Linux /proc)."""
    pages = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == leader_pid:  # pgrp (field 5 of stat; 3rd after the name)
            pages += int(fields[21])  # rss (field 24)
    return pages * 4096 / 2**20


def _prompt(rng: random.Random, index: int) -> list[int]:
    head = [(31 * h + 7 * j) % VOCAB for h in [index % HEADS] for j in range(HEAD_LEN)]
    return head + [rng.randrange(VOCAB) for _ in range(TAIL_LEN)]


def _worker(
    url: str, deadline: float, tally: _Tally, seed: int, abort_every: int, counter: list[int]
) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        with tally.lock:
            counter[0] += 1
            n = counter[0]
        cancel = 2 if abort_every and n % abort_every == 0 else None
        try:
            left = max(5.0, deadline - time.monotonic() + 60)
            result = stream_generate(url, _prompt(rng, n), 16, cancel_after=cancel, timeout_s=left)
        except (OSError, ValueError) as exc:
            tally.add(None, f"{type(exc).__name__}: {exc}")
            continue
        bad = result.status != 200 or (not result.cancelled and result.chunks == 0)
        tally.add(result, f"HTTP {result.status}" if bad else None)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def soak(
    url: str, minutes: float, concurrency: int, abort_every: int, pid: int | None, sample_s: float
) -> dict[str, Any]:
    tally, counter = _Tally(), [0]
    start = time.monotonic()
    deadline = start + minutes * 60
    threads = [
        threading.Thread(
            target=_worker, args=(url, deadline, tally, i, abort_every, counter), daemon=True
        )
        for i in range(concurrency)
    ]
    for t in threads:
        t.start()
    rss: list[tuple[float, float]] = []
    next_sample = start
    while any(t.is_alive() for t in threads):
        now = time.monotonic()
        if pid is not None and now >= next_sample:
            rss.append((round(now - start, 1), round(group_rss_mb(pid), 1)))
            next_sample = now + sample_s
        with tally.lock:
            done, errs = len(tally.results), len(tally.errors)
        frac = min(1.0, (now - start) / (deadline - start))
        bar = "#" * int(30 * frac)
        print(
            f"\rsoak [{bar:<30}] {now - start:5.0f}s req {done} err {errs}", end="", file=sys.stderr
        )
        time.sleep(2)
    print(file=sys.stderr)
    for t in threads:
        t.join(timeout=120)
    if pid is not None:
        rss.append((round(time.monotonic() - start, 1), round(group_rss_mb(pid), 1)))
    results = tally.results
    finished = [r for r in results if not r.cancelled and r.status == 200]
    ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
    return {
        "minutes": minutes,
        "concurrency": concurrency,
        "requests": len(results) + sum(1 for e in tally.errors if not e.startswith("HTTP")),
        "completed": len(finished),
        "cancelled": sum(1 for r in results if r.cancelled),
        "errors": len(tally.errors),
        "error_samples": tally.errors[:5],
        "cached_tokens": sum(r.cached_tokens for r in finished),
        "ttft_p50_s": _pct(ttfts, 0.5),
        "ttft_p90_s": _pct(ttfts, 0.9),
        "ttft_p99_s": _pct(ttfts, 0.99),
        "rss_mb": rss,
        "healthy_after": health(url),
    }


def add_soak_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "soak", help="timed load with aborts against a live server (RSS, TTFT, errors)"
    )
    p.add_argument("--minutes", type=float, required=True)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--abort-every", type=int, default=5, help="cancel every N-th request (0: none)")
    p.add_argument("--url", default=None, help="attach to this server (default: start one)")
    p.add_argument("--server-pid", type=int, default=None, help="its process group leader (RSS)")
    p.add_argument("--model", default="data/tiny-model", help="model of the server started")
    p.add_argument("--stock", action="store_true", help="start it without --enable-jenga")
    p.add_argument("--strategy", default="no_buffer", help="Mamba strategy of the server started")
    p.add_argument("--sample-s", type=float, default=10.0, help="RSS sampling period")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the report here")
    p.set_defaults(func=cmd_soak)
    return p


def cmd_soak(args: argparse.Namespace) -> int:
    if not args.minutes > 0 or args.concurrency < 1 or args.abort_every < 0:
        print("jenga-bench: error: need --minutes > 0, --concurrency >= 1", file=sys.stderr)
        return 2
    run = (args.minutes, args.concurrency, args.abort_every)
    if args.url is not None:
        report = soak(args.url, *run, args.server_pid, args.sample_s)
    else:
        from jenga_sglang.bench.drivers.server import LocalServer

        log = Path(args.json or "out/soak.json").with_suffix(".server.log")
        flags = [] if args.stock else ["--enable-jenga"]
        with LocalServer(args.model, flags, log=log, strategy=args.strategy) as server:
            report = soak(server.url, *run, server.pid, args.sample_s)
        text = log.read_text(errors="replace")
        report["server_log"] = str(log)
        report["log_leak"] = "leak" in text.lower()
        report["log_tracebacks"] = unexpected_tracebacks(text)  # SGLang's start-up one aside
    out = json.dumps(report, indent=1)
    print(out)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(out)
    return 1 if report["errors"] or not report["healthy_after"] else 0
