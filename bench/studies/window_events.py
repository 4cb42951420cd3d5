"""`jenga-bench window-events`: a router's view of a sliding-window worker, from its KV events.

    jenga-bench window-events [--model data/tiny-gpt_oss] [--variants stock,jenga]
        [--sessions 4] [--turns 3] [--branches 4] [--revisits 0] [--reply-tokens 40]
        [--server-flags FLAGS]
        [--out out/window-events]

One worker at a time (stock SGLang, `--enable-jenga`) of the tiny gpt-oss (sliding-window and
full attention layers, SGLang's separate window pool), publishing its cache's KV events
(`--kv-events-config`) to a block index that models smg's event-driven `cache_aware` policy
(bench/drivers/kv_index.py; smg itself cannot front gpt-oss offline). Sequential requests by
token ids: `sessions` chats of `turns` turns (each turn the last prompt, its reply and new
tokens), then `branches` requests that leave an earlier turn part-way through its reply, then
the next turn of the first `revisits` sessions (under a tight budget, their histories have
left the device by then). Before
each request the events settle and the index predicts the request's hit; the worker then
reports its cached tokens. A tight KV budget (`--max-total-tokens`) and a window freed every
decode step (`SGLANG_SWA_EVICTION_INTERVAL=1`) make the window pool trim and drop.

Reported per variant: requests, cached tokens, the index's predicted tokens, tokens predicted
over and under the hit (summed per request), the share predicted exactly, cached and predicted
tokens per kind of request, and the host tier's counters where the server has metrics on.

`--variants` takes every server of the sessions study (bench/studies/sessions_cpu.py
`VARIANTS`): with `--model data/tiny-model` and `jenga-host,stock-hicache` it measures what a
router predicts of hits served from host memory (the branches come back to sessions pushed
out of the device by the later ones).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
from pathlib import Path
from typing import Any

from jenga_sglang.bench.drivers.faults import generate
from jenga_sglang.bench.drivers.kv_index import BlockIndex, EventFeed
from jenga_sglang.bench.drivers.server import LocalServer, free_port
from jenga_sglang.bench.studies.sessions_cpu import VARIANTS as VARIANT_FLAGS
from jenga_sglang.bench.studies.sessions_cpu import host_metrics

#: gpt-oss needs an attention backend with sinks; on CPU SGLang's Triton one, interpreted
SERVER_FLAGS = ("--attention-backend", "triton", "--max-total-tokens", "1024")
SERVER_ENV = {"SGLANG_SWA_EVICTION_INTERVAL": "1"}


def first_prompts(sessions: int, seed: int) -> list[list[int]]:
    """Each session's first prompt (60-119 token ids); later turns and the branches are built
    from the worker's replies."""
    rng = random.Random(seed)
    return [[rng.randrange(5, 400) for _ in range(rng.randrange(60, 120))] for _ in range(sessions)]


def run_variant(model: str, variant: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from tqdm import tqdm

    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    index = BlockIndex()
    total = args.sessions * args.turns + args.branches + min(args.revisits, args.sessions)
    bar = tqdm(total=total, desc=variant, unit="req", file=sys.stderr, disable=args.no_progress)
    with bar, EventFeed(free_port()) as feed:
        flags = (*SERVER_FLAGS, *shlex.split(args.server_flags), "--kv-events-config",
                 feed.config(), *VARIANT_FLAGS[variant])  # fmt: skip
        log = out / f"{variant}.log"
        with LocalServer(model, flags, log=log, env=SERVER_ENV) as server:

            def ask(ids: list[int], kind: str) -> list[int]:
                index.apply(feed.take())
                predicted = index.predicted_hit(ids)
                status, body = generate(server.url, ids, args.reply_tokens, timeout_s=300)
                if status != 200:
                    raise RuntimeError(f"{variant}: HTTP {status}: {body}")
                cached = int(body["meta_info"]["cached_tokens"])
                rows.append({"kind": kind, "prompt": len(ids), "cached": cached,
                             "predicted": predicted})  # fmt: skip
                bar.update()
                return list(body["output_ids"])

            histories: list[list[int]] = []
            pending: list[list[int]] = []  # each session's next turn, asked last (revisits)
            for prompt in first_prompts(args.sessions, args.seed):
                for _ in range(args.turns):
                    reply = ask(prompt, "turn")
                    histories.append([*prompt, *reply])
                    prompt = [*prompt, *reply, *(rng.randrange(5, 400) for _ in range(20))]
                pending.append(prompt)
            for _ in range(args.branches):
                history = rng.choice(histories)
                cut = len(history) - rng.randrange(2, args.reply_tokens)  # inside the reply
                ask([*history[:cut], *(rng.randrange(5, 400) for _ in range(10))], "branch")
            for prompt in pending[: args.revisits]:
                ask(prompt, "revisit")
            # served from host memory (by either tier), where the server has metrics on
            host = host_metrics(server.url) if "--enable-metrics" in flags else {}
    return {"variant": variant, **summary(rows), "host": host, "requests_detail": rows}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    over = sum(max(0, r["predicted"] - r["cached"]) for r in rows)
    under = sum(max(0, r["cached"] - r["predicted"]) for r in rows)
    kinds = sorted({r["kind"] for r in rows})
    by_kind = {
        k: {f: sum(r[f] for r in rows if r["kind"] == k) for f in ("cached", "predicted")}
        for k in kinds
    }
    return {
        "by_kind": by_kind,
        "requests": len(rows),
        "prompt_tokens": sum(r["prompt"] for r in rows),
        "cached_tokens": sum(r["cached"] for r in rows),
        "predicted_tokens": sum(r["predicted"] for r in rows),
        "over_predicted_tokens": over,
        "under_predicted_tokens": under,
        "exact_share": round(sum(r["predicted"] == r["cached"] for r in rows) / len(rows), 3),
    }


def main(argv: list[str] | None = None) -> int:
    doc = __doc__.split("\n")[0]
    p = argparse.ArgumentParser(prog="jenga-bench window-events", description=doc)
    p.add_argument("--model", default="data/tiny-gpt_oss")
    p.add_argument("--variants", default="stock,jenga")
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--branches", type=int, default=4)
    p.add_argument(
        "--revisits", type=int, default=0, help="sessions whose next turn comes last of all"
    )
    p.add_argument(
        "--reply-tokens", type=int, default=40, help="per request (the window is 32 tokens)"
    )
    p.add_argument(
        "--server-flags",
        default="",
        help="more SGLang flags for every server, after the study's own (which they override)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/window-events")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v not in VARIANT_FLAGS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANT_FLAGS)}")
    if min(args.sessions, args.turns) < 1 or min(args.branches, args.revisits) < 0:
        p.error("--sessions and --turns must be >= 1, --branches and --revisits >= 0")
    if args.reply_tokens < 3:
        p.error("--reply-tokens must be >= 3")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for variant in args.variants.split(","):
        results.append(run_variant(args.model, variant, args, out))
        brief = {k: v for k, v in results[-1].items() if k != "requests_detail"}
        print(json.dumps(brief), flush=True)
    (out / "summary.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
