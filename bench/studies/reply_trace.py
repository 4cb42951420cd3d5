"""`jenga-bench reply-trace`: one greedy reply of a `sessions-cpu` run, traced.

    jenga-bench reply-trace --run out/host-gptoss-2 --session 2 --turn 5 \\
        --model data/tiny-gpt_oss --server-flags '--attention-backend triton'

The prompt that (session, turn) sent is rebuilt from the run's trace and the first server's
replies (`replies-<variant>.json`; equal earlier replies give equal prompts), through the
model's chat template, and sent as token ids to /generate with log-probabilities:

1. **stock, by cached prefix**: cold, then after a request of each prefix length (every
   `--step` tokens, and each of the last `--tail`) put exactly that prefix in its cache. A
   reply that depends on where the hit ends shows here.
2. **the variant, from host**: for each `--demote` length, that prefix is served, then
   `--fillers` unrelated prompts push it out of the device (to host memory with the tier),
   then the prompt, whose hit loads it back; the host hit tokens are read off /metrics.

Reported per request: the reply's tokens, their log-probabilities, the top-2 gap at each
token (a small gap is a near-tie) and the largest log-probability difference from stock's
cold reply. Bounded: a fixed list of requests, each with a timeout.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from jenga_sglang.bench.drivers import faults
from jenga_sglang.bench.drivers.server import LocalServer, scrape_counters
from jenga_sglang.bench.studies.sessions_cpu import HOST_COUNTERS, VARIANTS
from jenga_sglang.bench.traces.turns import OnlineConfig, sessions_from_trace

TIMEOUT_S = 600.0
TOLERANCE = 1e-4  # log-probability: stock's own drift across cached-prefix lengths is ~1e-6


def rebuild_prompt(
    run: Path, session: int, turn: int, first: str
) -> tuple[list[dict[str, str]], int]:
    """The chat messages (session, turn) sent in `run`, with the replies of server `first`,
    and its reply length."""
    summary = json.loads((run / "summary.json").read_text())
    client = summary["client"]
    config = OnlineConfig(
        url="http://127.0.0.1",
        max_user_words=client["max_user_words"],
        max_output_tokens=client["max_output_tokens"],
    )
    turns = {t[0].session_id: t for t in sessions_from_trace(summary["trace"], config)}[session]
    replies = {
        (s, t): text for s, t, text, *_ in json.loads((run / f"replies-{first}.json").read_text())
    }
    messages: list[dict[str, str]] = []
    for index in range(turn + 1):
        messages.append({"role": "user", "content": turns[index].user_text})
        if index < turn:
            messages.append({"role": "assistant", "content": replies[(session, index)]})
    return messages, turns[turn].max_tokens


def template_ids(model: str, messages: list[dict[str, str]]) -> list[int]:
    from transformers import AutoTokenizer

    encoded: Any = AutoTokenizer.from_pretrained(model).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True
    )
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]


def generate(
    url: str, ids: list[int], n: int, logprobs: bool = False, start: int | None = None
) -> dict[str, Any]:
    """/generate's body (faults.py `generate`), with the top 2 log-probabilities per reply
    token under `logprobs` (and each prompt token's from position `start`, if given); an
    error status raises."""
    status, body = faults.generate(
        url,
        ids,
        n,
        timeout_s=TIMEOUT_S,
        logprobs=logprobs,
        top_logprobs=2 if logprobs and start is None else 0,
        logprob_start_len=start,
    )
    if status != 200:
        raise RuntimeError(f"/generate: HTTP {status}: {body}")
    return body


def traced(url: str, ids: list[int], n: int) -> dict[str, Any]:
    """The greedy reply to `ids`: tokens, log-probabilities, top-2 gaps, cached tokens."""
    meta = generate(url, ids, n, logprobs=True)["meta_info"]
    chosen = meta["output_token_logprobs"]
    gaps = [top[0][0] - top[1][0] for top in meta["output_top_logprobs"]]
    return {
        "tokens": [int(t[1]) for t in chosen],
        "logprobs": [float(t[0]) for t in chosen],
        "gaps": [round(g, 6) for g in gaps],
        "cached": int(meta.get("cached_tokens", 0)),
    }


def by_prefix(url: str, ids: list[int], n: int, lengths: list[int]) -> dict[int, dict[str, Any]]:
    """Stage 1: the reply after exactly `length` tokens of the prompt were cached (0: cold)."""
    out = {}
    for length in lengths:
        faults.flush_cache(url, TIMEOUT_S)
        if length:
            generate(url, ids[:length], 1)
        out[length] = traced(url, ids, n)
    return out


def from_host(
    url: str, ids: list[int], n: int, lengths: list[int], fillers: int, vocab: int
) -> dict[int, dict[str, Any]]:
    """Stage 2: the reply after a prefix of each length was pushed out by `fillers` prompts
    as long as the whole one, with the host hit tokens its load brought."""
    out = {}
    longest = len(ids)
    for length in lengths:
        faults.flush_cache(url, TIMEOUT_S)
        generate(url, ids[:length], 1)
        for k in range(fillers):  # unrelated ids: no prefix in common with the prompt's
            generate(url, [1 + (37 * k + 11 * j + 3) % (vocab - 2) for j in range(longest)], 1)
        before = scrape_counters(url, HOST_COUNTERS)["host_hit_tokens_total"]
        out[length] = traced(url, ids, n)
        after = scrape_counters(url, HOST_COUNTERS)["host_hit_tokens_total"]
        out[length]["host_hit_tokens"] = int(after - before)
    return out


def prefill_scores(url: str, ids: list[int], tokens: list[int]) -> list[float]:
    """Each of `tokens`' log-probability after `ids` and the tokens before it, all from one
    cold prefill of `ids + tokens` (no decode step)."""
    faults.flush_cache(url, TIMEOUT_S)
    body = generate(url, ids + tokens, 1, logprobs=True, start=len(ids) - 1)
    scored = body["meta_info"]["input_token_logprobs"][-len(tokens) :]
    return [float(t[0]) for t in scored]


def first_divergence(decoded: list[float], prefilled: list[float], tolerance: float) -> int | None:
    """The first reply token whose two log-probabilities differ by more than `tolerance`."""
    pairs = enumerate(zip(decoded, prefilled, strict=True))
    return next((i for i, (a, b) in pairs if abs(a - b) > tolerance), None)


def decode_against_prefill(
    url: str, ids: list[int], n: int, lengths: list[int]
) -> dict[int, dict[str, Any]]:
    """Stage 3: for the first `length` tokens of the prompt, the cold reply as decode scored
    it against a prefill's scores of the same tokens, and where the two first part."""
    out = {}
    for length in lengths:
        prompt = ids[:length]
        faults.flush_cache(url, TIMEOUT_S)
        decoded = traced(url, prompt, n)
        prefilled = prefill_scores(url, prompt, decoded["tokens"])
        first = first_divergence(decoded["logprobs"], prefilled, TOLERANCE)
        pairs = zip(decoded["logprobs"], prefilled, strict=True)
        out[length] = {
            "tokens": decoded["tokens"],
            "decode": decoded["logprobs"],
            "prefill": prefilled,
            "largest_difference": max(abs(a - b) for a, b in pairs),
            "first_divergent_token": first,
            "context_there": None if first is None else length + first,
        }
    return out


def drift(reference: dict[str, Any], other: dict[str, Any]) -> float | None:
    """The largest log-probability difference from `reference` (None: the tokens differ)."""
    if other["tokens"] != reference["tokens"]:
        return None
    pairs = zip(reference["logprobs"], other["logprobs"], strict=True)
    return max(abs(float(a) - float(b)) for a, b in pairs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jenga-bench reply-trace", description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="a sessions-cpu --out folder with replies files")
    p.add_argument("--session", type=int, required=True)
    p.add_argument("--turn", type=int, required=True)
    p.add_argument("--first", default="stock", help="whose replies rebuild the history")
    p.add_argument("--model", default="data/tiny-gpt_oss")
    p.add_argument("--max-total-tokens", type=int, default=1024)
    p.add_argument("--server-flags", default="", help="SGLang flags for both servers")
    p.add_argument("--variant", default="jenga-host", choices=sorted(VARIANTS))
    p.add_argument("--step", type=int, default=16, help="stage 1: every this many tokens")
    p.add_argument("--tail", type=int, default=12, help="stage 1: and each of the last this many")
    p.add_argument("--demote", default="", help="stage 2: prefix lengths, comma-separated")
    p.add_argument("--fillers", type=int, default=3)
    p.add_argument("--cuts", default="", help="stage 3: also these prompt lengths, comma-separated")
    p.add_argument("--out", default="out/reply-trace")
    args = p.parse_args(argv)
    if args.step < 1 or args.tail < 0 or args.fillers < 0:
        p.error("--step must be >= 1, --tail and --fillers >= 0")
    run, out = Path(args.run), Path(args.out)
    messages, n = rebuild_prompt(run, args.session, args.turn, args.first)
    ids = template_ids(args.model, messages)
    vocab = int(json.loads((Path(args.model) / "config.json").read_text())["vocab_size"])
    demote = [int(x) for x in args.demote.split(",") if x]
    cuts = [int(x) for x in args.cuts.split(",") if x]
    if any(not 0 < d < len(ids) for d in demote + cuts):
        p.error(f"--demote and --cuts lengths must be in (0, {len(ids)})")
    out.mkdir(parents=True, exist_ok=True)
    base = ["--max-total-tokens", str(args.max_total_tokens), *shlex.split(args.server_flags)]
    tail = range(max(1, len(ids) - args.tail), len(ids))
    lengths = sorted({0, *range(args.step, len(ids), args.step), *tail})
    report: dict[str, Any] = {"prompt_tokens": len(ids), "reply_tokens": n}
    with LocalServer(args.model, base, log=out / "server-stock.log") as server:
        report["stock"] = by_prefix(server.url, ids, n, lengths)
        checks = decode_against_prefill(server.url, ids, n, sorted({*cuts, len(ids)}))
    report["decode_vs_prefill"] = checks
    cold = report["stock"][0]
    drifts = [drift(cold, r) for r in report["stock"].values()]
    report["stock_drift"] = None if None in drifts else max(d for d in drifts if d is not None)
    if demote:
        flags = [*base, *VARIANTS[args.variant]]
        flags += [] if "--enable-metrics" in flags else ["--enable-metrics"]
        with LocalServer(args.model, flags, log=out / f"server-{args.variant}.log") as server:
            report[args.variant] = from_host(server.url, ids, n, demote, args.fillers, vocab)
        report["variant_drift"] = {k: drift(cold, r) for k, r in report[args.variant].items()}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    kept = ("largest_difference", "first_divergent_token", "context_there")
    report_brief = {k: v for k, v in report.items() if k not in ("stock", args.variant)}
    report_brief["decode_vs_prefill"] = {
        length: {k: check[k] for k in kept} for length, check in checks.items()
    }
    print(json.dumps(report_brief))
    print(json.dumps({"cold": cold}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
