"""`jenga-bench speculative-cpu`: speculative decoding served on CPU, stock against jenga.

    jenga-bench speculative-cpu [--model data/tiny-model]
        [--algorithm ngram|standalone|eagle|nextn]
        [--draft-model data/tiny-spec/draft] [--variants stock,jenga]
        [--strategies no_buffer,extra_buffer] [--sessions 3] [--turns 2] [--branches 3]
        [--reply-tokens 16] [--server-flags FLAGS] [--out out/speculative-cpu]

One server at a time per variant and Mamba strategy (bench/drivers/server.py), each with
`--speculative-algorithm NGRAM` (chains of 3 drafts), `STANDALONE` or `EAGLE` (a draft model
proposing chains of 3: `make tiny-spec`'s draft/ or eagle/, served with its target/ as
`--model`) or `NEXTN` (the model's own MTP layer: `--model data/tiny-spec/mtp`), the Triton
attention backend (the verify forward's draft mask) and the CPU interpreter mode's
speculative stand-ins (jenga_sglang/cpu_speculative.py). `jenga` is `--enable-jenga` with the
Jenga pool (a draft model's KV in the target's KV pages: binding/pools/draft.py).
Sequential requests by token ids: per session, `turns` turns (each the last prompt, its reply
and new tokens), then a retry of its first prompt (NGRAM's corpus now holds that reply, so
its drafts are accepted); then `branches` branch points part-way into a session's first prompt,
each left by two requests with different tails (the second can resume from the first's
branch-point state).

Reported per variant and strategy: cached tokens (and, with the host tier, those loaded from
host), verify rounds, proposed and accepted drafts, mean acceptance length (tokens per verify
round), summed latency; for a variant served after stock, whether every request's output
equals stock's. `--variants stock,jenga-host` serves with our host tier, and a small budget
(`--server-flags '--max-total-tokens 320 --max-mamba-cache-size 6'`) pushes sessions off the
device; this workload comes back to few of them (no host hit at that budget with STANDALONE),
so the round trip of a draft's rows is tests/test_e2e_host_tier.py's.
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
from jenga_sglang.bench.drivers.server import STRATEGIES, LocalServer
from jenga_sglang.bench.studies.sessions_cpu import VARIANTS, host_metrics

#: stock, jenga, jenga with the live host tier (sessions_cpu.py's rates), our tree on SGLang's pools
VARIANT_FLAGS = {name: VARIANTS[name] for name in ("stock", "jenga", "jenga-host", "jenga-no-pool")}

COMMON_FLAGS: tuple[str, ...] = (
    "--speculative-num-draft-tokens", "4",
    "--attention-backend", "triton",  # torch_native cannot run the verify forward
    "--max-running-requests", "4",
    "--mem-fraction-static", "0.3",  # SGLang's start-up check counts the verify scratch
)  # fmt: skip
ALGORITHMS = ("ngram", "standalone", "eagle", "nextn")


def algorithm_flags(algorithm: str, draft_model: str) -> list[str]:
    """The server flags of `algorithm` (a chain of 3 drafts per verify round)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if algorithm == "ngram":
        chain = ["--speculative-ngram-max-bfs-breadth", "1"]  # a chain, not a tree
        return ["--speculative-algorithm", "NGRAM", *chain, *COMMON_FLAGS]
    steps = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1"]
    # NEXTN's draft is the model's own MTP layers, read from its checkpoint.
    draft = [] if algorithm == "nextn" else ["--speculative-draft-model-path", draft_model]
    return ["--speculative-algorithm", algorithm.upper(), *draft, *steps, *COMMON_FLAGS]


def workload(args: argparse.Namespace) -> list[tuple[str, list[int]]]:
    """Each session's first prompt and the branches (later turns are built from replies):
    (kind, token ids); turns are marked 'session'."""
    rng = random.Random(args.seed)
    firsts = [
        [rng.randrange(5, 400) for _ in range(rng.randrange(100, 160))]
        for _ in range(args.sessions)
    ]
    items: list[tuple[str, list[int]]] = [("session", p) for p in firsts]
    for _ in range(args.branches):  # two requests leave each branch point
        first = rng.choice(firsts)
        cut = rng.randrange(40, len(first) - 10)
        for _ in range(2):
            items.append(("branch", [*first[:cut], *(rng.randrange(5, 400) for _ in range(12))]))
    return items


def run_variant(
    model: str, variant: str, strategy: str, args: argparse.Namespace, out: Path
) -> list[dict[str, Any]]:
    """Serve the workload; one row per request."""
    from tqdm import tqdm

    rng = random.Random(args.seed + 1)
    rows: list[dict[str, Any]] = []
    items = workload(args)
    total = sum(args.turns + 1 if kind == "session" else 1 for kind, _ in items)
    bar = tqdm(total=total, desc=f"{variant} {strategy}", unit="req", file=sys.stderr,
               disable=args.no_progress)  # fmt: skip
    log = out / f"{args.algorithm}-{variant}-{strategy}.log"
    flags = [
        *algorithm_flags(args.algorithm, args.draft_model),
        *shlex.split(args.server_flags),
        *VARIANT_FLAGS[variant],
    ]
    tier = "--jenga-host-gb" in flags  # the host tier's counters, per request
    with bar, LocalServer(model, flags, log=log, strategy=strategy) as server:
        loaded = 0.0  # host hit tokens so far

        def ask(ids: list[int], kind: str) -> list[int]:
            nonlocal loaded
            status, body = generate(server.url, ids, args.reply_tokens, timeout_s=600)
            if status != 200:
                raise RuntimeError(f"{variant} {strategy}: HTTP {status}: {body}")
            meta = body["meta_info"]
            rows.append({
                "kind": kind, "prompt": len(ids), "cached": int(meta["cached_tokens"]),
                "verify_rounds": int(meta.get("spec_verify_ct", 0)),
                "proposed": int(meta.get("spec_num_proposed_drafts", 0)),
                "accepted": int(meta.get("spec_num_correct_drafts", 0)),
                "latency_s": float(meta["e2e_latency"]), "output": list(body["output_ids"]),
            })  # fmt: skip
            if tier:
                before, loaded = loaded, host_metrics(server.url)["host_hit_tokens_total"]
                rows[-1]["from_host"] = int(loaded - before)
            bar.update()
            return list(body["output_ids"])

        for kind, ids in items:
            if kind == "branch":
                ask(ids, "branch")
                continue
            prompt = ids
            for _ in range(args.turns):
                reply = ask(prompt, "turn")
                prompt = [*prompt, *reply, *(rng.randrange(5, 400) for _ in range(16))]
            ask(ids, "retry")
    return rows


def summary(rows: list[dict[str, Any]], stock: list[dict[str, Any]] | None) -> dict[str, Any]:
    rounds = sum(r["verify_rounds"] for r in rows)
    out: dict[str, Any] = {
        "requests": len(rows),
        "prompt_tokens": sum(r["prompt"] for r in rows),
        "cached_tokens": sum(r["cached"] for r in rows),
        "verify_rounds": rounds,
        "proposed_drafts": sum(r["proposed"] for r in rows),
        "accepted_drafts": sum(r["accepted"] for r in rows),
        "accept_length": round((rounds + sum(r["accepted"] for r in rows)) / max(rounds, 1), 3),
        "latency_s": round(sum(r["latency_s"] for r in rows), 1),
    }
    if any("from_host" in r for r in rows):
        out["from_host_tokens"] = sum(r.get("from_host", 0) for r in rows)
    if stock is not None:
        out["outputs_equal_stock"] = [r["output"] for r in rows] == [r["output"] for r in stock]
    return out


def main(argv: list[str] | None = None) -> int:
    doc = __doc__.split("\n")[0]
    p = argparse.ArgumentParser(prog="jenga-bench speculative-cpu", description=doc)
    p.add_argument("--model", default="data/tiny-model")
    p.add_argument("--algorithm", choices=ALGORITHMS, default="ngram")
    p.add_argument(
        "--draft-model", default="data/tiny-spec/draft", help="STANDALONE's or EAGLE's draft"
    )
    p.add_argument("--variants", default="stock,jenga", help=", ".join(VARIANT_FLAGS))
    p.add_argument(
        "--server-flags", default="", help="more flags for every server (e.g. a small budget)"
    )
    p.add_argument("--strategies", default="no_buffer,extra_buffer")
    p.add_argument("--sessions", type=int, default=3)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--branches", type=int, default=3)
    p.add_argument("--reply-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/speculative-cpu")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    variants, strategies = args.variants.split(","), args.strategies.split(",")
    unknown = [v for v in variants if v not in VARIANT_FLAGS]
    unknown += [s for s in strategies if s not in STRATEGIES]
    if unknown:
        p.error(f"unknown {unknown}; variants: {', '.join(VARIANT_FLAGS)}; "
                f"strategies: {', '.join(STRATEGIES)}")  # fmt: skip
    if min(args.sessions, args.turns) < 1 or args.branches < 0 or args.reply_tokens < 2:
        p.error("--sessions and --turns must be >= 1, --branches >= 0, --reply-tokens >= 2")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for strategy in strategies:
        stock = None
        for variant in variants:
            rows = run_variant(args.model, variant, strategy, args, out)
            brief = {"algorithm": args.algorithm, "variant": variant, "strategy": strategy,
                     **summary(rows, stock)}  # fmt: skip
            stock = rows if variant == "stock" else stock
            print(json.dumps(brief), flush=True)
            results.append({**brief, "requests_detail": rows})
    (out / f"summary-{args.algorithm}.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
