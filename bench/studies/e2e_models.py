"""`make e2e-models`: every tiny model family served stock and with --enable-jenga on CPU.

For each family (bench/drivers/tiny_families.py; built with scripts/make_tiny_model.py when
missing) and page size: start a stock server, replay one session through /generate, stop it;
then the same with `--enable-jenga`. The session, greedy, token ids (no tokenizer in the loop):

1. turn 1: a 200-token prompt, 40 new tokens (a reply longer than gpt-oss's tiny window, whose
   decode frees the request's out-of-window SWA slots);
2. turn 2: turn 1's prompt + its reply + 40 new tokens (a chat's next turn);
3. branch A: turn 1's first 150 tokens + 40 other tokens (it leaves the session mid-prompt);
4. branch B: the same 150 tokens + 40 tokens again different: the request that can resume from
   the branch point once A has been served (a state model keeps its states only at positions
   some request computed; Jenga plans one at A's branch point).

`cached_tokens_branch` is branch B's; `identical_outputs` compares all four replies, and
`max_logprob_diff` the log-probabilities of every reply token (identical hits compute the same
thing; a longer hit, such as Jenga's at a branch point, only reorders float sums).
`prefill_rounds` counts the prefill forwards each server ran (its "Prefill batch" log lines);
ours also reports, from its `--enable-metrics` series, the checkpoints its prefills captured
in-pass and the chunks it cut at a checkpoint instead (each one more prefill round). A server
that refuses the model at start-up (`served: false`) is reported with its error line.

Page sizes above 1 run a state family (Mamba2, Gated DeltaNet) with
`--mamba-radix-cache-strategy extra_buffer`, as SGLang requires (no_buffer keeps states at page
1 only).

    jenga-bench e2e-models [--families a,b] [--page-sizes 1,16] [--out out/e2e-models]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jenga_sglang.bench.drivers.faults import generate
from jenga_sglang.bench.drivers.server import LocalServer, ServerError, scrape_counters
from jenga_sglang.bench.drivers.tiny_families import FAMILIES, family_config
from jenga_sglang.bench.studies.e2e_cpu import prefill_rounds
from jenga_sglang.models import spec_from_hf_config

ROOT = Path(__file__).resolve().parents[2]
FIRST_ID, VOCAB = 6, 512  # ids 0-5 are the shared tokenizer's special tokens
PROMPT, BRANCH_AT, TAIL, NEW_TOKENS, REPLY_TOKENS = 200, 150, 40, 8, 40
STEPS = ("turn1", "turn2", "branch_a", "branch_b")
#: Our counters read off /metrics after the replay (binding/cache/metrics.py).
COUNTERS = {
    "inpass_captures": "jenga:inpass_captures_total",
    "inpass_captures_lost": "jenga:inpass_captures_lost_total",
    "prefill_cuts": "jenga:prefill_cuts_total",
}
#: A traceback's last line, e.g. "triton.runtime.errors.InterpreterError: ..."
_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception)\b[^ ]*: ")


def session_prompts(seed: int = 0) -> dict[str, list[int]]:
    """The prompts of steps turn1, branch_a and branch_b (turn2 needs turn1's reply)."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(FIRST_ID, VOCAB) for _ in range(n)]

    head = ids(PROMPT)
    return {
        "turn1": head,
        "turn2_tail": ids(TAIL),
        "branch_a": head[:BRANCH_AT] + ids(TAIL),
        "branch_b": head[:BRANCH_AT] + ids(TAIL),
    }


def _ask(url: str, ids: list[int], new_tokens: int = NEW_TOKENS) -> dict[str, Any]:
    status, body = generate(url, ids, new_tokens, timeout_s=600.0, logprobs=True)
    if status != 200:
        raise ServerError(f"/generate answered {status}: {str(body)[:500]}")
    meta = body.get("meta_info", {})
    return {
        "output_ids": list(body.get("output_ids") or []),
        "text": body.get("text"),
        "cached_tokens": int(meta.get("cached_tokens", 0)),
        "prompt_tokens": int(meta.get("prompt_tokens", len(ids))),
        "logprobs": [float(x[0]) for x in meta.get("output_token_logprobs") or []],
    }


def replay(url: str, seed: int = 0) -> dict[str, dict[str, Any]]:
    """The four steps, in order, one request at a time."""
    prompts = session_prompts(seed)
    out = {"turn1": _ask(url, prompts["turn1"], REPLY_TOKENS)}
    out["turn2"] = _ask(url, prompts["turn1"] + out["turn1"]["output_ids"] + prompts["turn2_tail"])
    out["branch_a"] = _ask(url, prompts["branch_a"])
    out["branch_b"] = _ask(url, prompts["branch_b"])
    return out


def counters(url: str) -> dict[str, float]:
    """Our counters from the server's Prometheus text (summed over label sets; 0 if absent)."""
    return scrape_counters(url, COUNTERS)


def _first_error(log: Path) -> str:
    """The line of the server log that says why it stopped: the last exception line (our
    start-up errors name the architecture), else the last line."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    hits = [ln.strip() for ln in lines if _EXCEPTION_LINE.match(ln)]
    if hits:
        return hits[-1][:400]
    return lines[-1][:400] if lines else "(no log)"


def serve_family(
    model: Path,
    jenga: bool,
    log: Path,
    flags: Sequence[str],
    strategy: str = "no_buffer",
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One server for one family: the replay, its prefill rounds (and our counters), or why
    the server did not come up."""
    extra = [*(["--enable-jenga"] if jenga else []), "--enable-metrics", *flags]
    try:
        with LocalServer(
            str(model), extra, log=log, ready_timeout_s=420.0, strategy=strategy, env=env
        ) as server:
            run = {"served": True, "steps": replay(server.url)}
            if jenga:
                run["counters"] = counters(server.url)
            run["prefill_rounds"] = prefill_rounds(log.read_text(errors="replace"))
            return run
    except (ServerError, OSError) as exc:  # OSError: the server died under a request
        return {"served": False, "error": _first_error(log) or str(exc)[:400]}


def ensure_model(family: str, path: Path) -> None:
    if (path / "model.safetensors").exists():
        return
    script = ROOT / "scripts" / "make_tiny_model.py"
    cmd = [sys.executable, str(script), "--family", family, "--out", str(path)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)


def family_row(
    family: str, stock: dict[str, Any], jenga: dict[str, Any], page: int
) -> dict[str, Any]:
    """The summary object of one family (the issue's fields, plus why a server failed)."""
    arch = FAMILIES[family].fields["architectures"][0]
    row: dict[str, Any] = {"family": family, "arch": arch, "page_size": page}
    row["served"] = bool(stock["served"] and jenga["served"])
    both = row["served"]

    def cached(run: dict[str, Any], step: str) -> int | None:
        return int(run["steps"][step]["cached_tokens"]) if run["served"] else None

    row["identical_outputs"] = (
        all(stock["steps"][s]["output_ids"] == jenga["steps"][s]["output_ids"] for s in STEPS)
        if both
        else None
    )
    row["max_logprob_diff"] = _logprob_diff(stock, jenga) if both else None
    row["cached_tokens_turn2"] = cached(jenga, "turn2")
    row["cached_tokens_branch"] = cached(jenga, "branch_b")
    row["stock_cached_tokens_turn2"] = cached(stock, "turn2")
    row["stock_cached_tokens_branch"] = cached(stock, "branch_b")
    row["prefill_rounds"] = jenga.get("prefill_rounds")
    row["stock_prefill_rounds"] = stock.get("prefill_rounds")
    for key in COUNTERS:
        row[key] = int(jenga["counters"][key]) if "counters" in jenga else None
    row["stock_served"] = stock["served"]
    if not stock["served"]:
        row["stock_error"] = stock["error"]
    if not jenga["served"]:
        row["jenga_error"] = jenga["error"]
    return row


def table(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        "arch",
        "served",
        "identical",
        "max logprob diff",
        "turn2 j/s",
        "branch j/s",
        "rounds j/s",
        "captures / cuts",
        "page",
        "note",
    )
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        note = r.get("stock_error") or r.get("jenga_error") or ""  # stock failing comes first
        lines.append(
            " | ".join(
                str(x)
                for x in (
                    r["arch"],
                    r["served"],
                    r["identical_outputs"],
                    _fmt(r.get("max_logprob_diff")),
                    f"{r['cached_tokens_turn2']}/{r['stock_cached_tokens_turn2']}",
                    f"{r['cached_tokens_branch']}/{r['stock_cached_tokens_branch']}",
                    f"{r.get('prefill_rounds')}/{r.get('stock_prefill_rounds')}",
                    f"{r.get('inpass_captures')} / {r.get('prefill_cuts')}",
                    r["page_size"],
                    note[:100],
                )
            )
        )
    return "\n".join(lines)


def _logprob_diff(stock: dict[str, Any], jenga: dict[str, Any]) -> float:
    """Largest difference of a reply token's log-probability between the two servers."""
    diffs = [
        abs(a - b)
        for step in STEPS
        for a, b in zip(
            stock["steps"][step]["logprobs"], jenga["steps"][step]["logprobs"], strict=False
        )
    ]
    return max(diffs, default=0.0)


def strategy_for(family: str, page: int) -> str:
    """SGLang keeps a state family's states at page 1 only without the extra buffer."""
    has_state = spec_from_hf_config(family_config(family, VOCAB)).has_mamba
    return "extra_buffer" if has_state and page > 1 else "no_buffer"


def _fmt(diff: float | None) -> str:
    return "-" if diff is None else f"{diff:.1e}"


def run_models(
    families: Sequence[str],
    out: Path,
    data: Path,
    pages: Sequence[int] = (1,),
    *,
    update: bool = False,
) -> list[dict[str, Any]]:
    """Serve each family at each page size stock then with Jenga; summary.json is rewritten
    after each one (a row per family and page size).

    `update`: keep the rows of other families and page sizes from an existing summary.json
    (rerunning one, e.g. after a server that failed for a reason outside the model)."""
    out.mkdir(parents=True, exist_ok=True)
    summary = out / "summary.json"
    runs = [(family, page) for family in families for page in pages]
    kept: list[dict[str, Any]] = []
    if update and summary.exists():
        kept = [
            r
            for r in json.loads(summary.read_text())
            if (r.get("family"), r.get("page_size")) not in runs
        ]
    rows: list[dict[str, Any]] = []
    for family, page in runs:
        spec = FAMILIES[family]
        flags = [*spec.serve_flags, *(["--page-size", str(page)] if page != 1 else [])]
        env, strategy = dict(spec.serve_env), strategy_for(family, page)
        model = data / f"tiny-{family}"
        ensure_model(family, model)
        name = family if page == 1 else f"{family}-p{page}"
        stock = serve_family(model, False, out / f"{name}-stock.log", flags, strategy, env)
        # A model stock SGLang cannot serve on CPU has no baseline: no point starting ours.
        jenga = (
            serve_family(model, True, out / f"{name}-jenga.log", flags, strategy, env)
            if stock["served"]
            else {"served": False, "error": "not tried: stock SGLang did not serve it"}
        )
        rows.append(family_row(family, stock, jenga, page))
        summary.write_text(json.dumps(kept + rows, indent=2) + "\n")
        print(f"e2e-models: {name}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="e2e-models", description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated")
    parser.add_argument("--out", default="out/e2e-models", help="logs and summary.json")
    parser.add_argument("--data", default="data", help="tiny models live in DATA/tiny-FAMILY")
    parser.add_argument(
        "--page-sizes", default="1", help="comma-separated SGLang --page-size values (each run)"
    )
    parser.add_argument(
        "--update", action="store_true", help="keep other families' rows of summary.json"
    )
    args = parser.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown or not families:
        print(f"e2e-models: unknown families {unknown}; of {', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        pages = [int(p) for p in args.page_sizes.split(",") if p]
    except ValueError:
        pages = []
    if not pages or min(pages) < 1:
        print(
            f"e2e-models: --page-sizes needs positive integers, got {args.page_sizes!r}",
            file=sys.stderr,
        )
        return 2
    run_models(families, out, Path(args.data), pages, update=args.update)
    print(table(json.loads((out / "summary.json").read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
