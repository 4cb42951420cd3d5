"""`jenga-bench online`: its flags and its exit status (the client is bench/studies/online.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from jenga_sglang.bench.studies.online import OnlineError, replay, summarize
from jenga_sglang.bench.traces.turns import OnlineConfig, sessions_from_trace


def add_online_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Mount ``online`` on the ``jenga-bench`` sub-parsers; sets ``func`` to :func:`cmd_online`."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "online", help="replay trace sessions against an OpenAI-compatible chat server"
    )
    p.add_argument("--url", default=None, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument(
        "--trace",
        required=True,
        help="JSONL trace (.gz / .xz accepted) or SGLang agentic-trace JSON (.json)",
    )
    p.add_argument(
        "--write-agentic-trace",
        default=None,
        metavar="OUT.json",
        help="write the JSONL trace's sessions in SGLang's agentic-trace format and exit",
    )
    p.add_argument("--max-requests", type=int, default=50, help="requests in all (default 50)")
    p.add_argument("--max-seconds", type=float, default=120.0, help="time budget (default 120)")
    p.add_argument("--concurrency", type=int, default=4, help="sessions at a time (default 4)")
    p.add_argument("--max-user-words", type=int, default=128, help="words per user message")
    p.add_argument("--max-output-tokens", type=int, default=32, help="reply tokens at most")
    p.add_argument("--model", default=None, help="model name (default: the server's first)")
    p.add_argument(
        "--radix-sessions",
        action="store_true",
        help="each conversation as an SGLang session (/open_session, session_id, "
        "/close_session), for a server with --enable-session-radix-cache",
    )
    p.add_argument("--json", action="store_true", help="print the whole summary as one line")
    p.set_defaults(func=cmd_online)
    return p


def cmd_online(args: argparse.Namespace) -> int:
    """Run the replay. Exit 0, 1 when any request failed or the server is unreachable, and 2 on
    bad input (settings, trace), each failure as one line on stderr like the rest of the CLI."""
    try:
        if args.url is None and not args.write_agentic_trace:
            raise ValueError("--url is required to replay")
        config = OnlineConfig(
            url=args.url or "http://127.0.0.1:30000",  # not contacted when only writing
            max_requests=args.max_requests,
            max_seconds=args.max_seconds,
            concurrency=args.concurrency,
            max_user_words=args.max_user_words,
            max_output_tokens=args.max_output_tokens,
            model=args.model,
            radix_sessions=args.radix_sessions,
        )
        from jenga_sglang.bench.traces.agentic_trace import (
            is_agentic_trace,
            read_agentic_trace,
            write_agentic_trace,
        )

        if args.write_agentic_trace:
            count = write_agentic_trace(args.trace, args.write_agentic_trace, config)
            print(json.dumps({"conversations": count, "out": args.write_agentic_trace}))
            return 0
        if is_agentic_trace(args.trace):
            sessions = read_agentic_trace(args.trace, config)
        else:
            sessions = sessions_from_trace(args.trace, config)
    except (ValueError, OSError) as exc:
        print(f"jenga-bench: error: {exc}", file=sys.stderr)
        return 2
    start = time.monotonic()
    try:
        results = asyncio.run(replay(sessions, config))
    except (OnlineError, OSError) as exc:  # e.g. nothing listening at --url
        print(f"jenga-bench: error: {config.url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    summary = summarize(results, time.monotonic() - start)
    if args.json:
        print(json.dumps(summary, separators=(",", ":")))
    else:
        brief = {k: v for k, v in summary.items() if k != "records"}
        print(json.dumps(brief, indent=2))
    return 1 if summary["errors"] else 0
