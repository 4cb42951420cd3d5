"""`jenga-bench pd-cpu`: prefill-decode disaggregation of the tiny hybrid model on CPU, stock and
with jenga (docs/sglang.md, "Prefill-decode disaggregation").

    jenga-bench pd-cpu [--model data/tiny-model] [--variants stock,jenga]
        [--sessions 3] [--turns 3] [--forks 2] [--reply-tokens 12] [--aborts 4]
        [--tp 1] [--server-flags FLAGS] [--out out/pd-cpu]

Each variant is a prefill server (`--disaggregation-mode prefill`) and a decode server
(`--disaggregation-mode decode`), each with the variant's flags for its side (`VARIANTS`: stock;
jenga with the Jenga pool on both sides; our tree over SGLang's pools on the prefill side, and on
both; stock and jenga with the decode side's own radix cache), SGLang's Mooncake transfer backend
with the engine stood in for by loopback TCP (jenga_sglang/cpu_transfer.py, a CPU test shim: the KV
and the Mamba state move as bytes between the two processes). First `--aborts` requests of their
own are aborted (`ABORTS`: on both sides, on the prefill side alone, on the decode side alone, at
0-2.5 s: in the bootstrap, the transfer and decode; SGLang's PD timeouts are cut to 30 s, `PD_ENV`,
so a side whose peer gave up fails in bounded time). Then the load, whose replies show that the
aborts left the pools and trees sound (SGLang's idle check stops a scheduler on a leaked page). A
client does what SGLang's PD router does: every request goes to both servers with the prefill
server's bootstrap address and a fresh room. A single stock server (no PD) serves the same requests
first, as the reference. `--tp N` gives every server, the reference's too, N tensor-parallel
ranks (`_parallel`). The load (`load`) is sequential: multi-turn sessions of greedy /generate
turns, each turn's prompt the previous prompt, its reply and new ids, then forks of each session's
first prompt, so the prefill side's cache decides what each request recomputes.

Reported per variant: whether every reply equals the reference's, the prefill side's cached tokens
per request and its prefill rounds (the load's), the decode side's cached tokens (SGLang sends the
prefill side's count with the first token, in the metadata buffers the engine moves too; with the
decode side's own radix cache, its own hit where that is longer), the bytes the decode side
received for the load, what each side answered the aborted requests, whether both servers are alive
after the load, leak reports and tracebacks in either log.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from jenga_sglang.bench.drivers.faults import (
    abort_request,
    generate_body,
    health,
    post_generate,
    unexpected_tracebacks,
)
from jenga_sglang.bench.drivers.server import LocalServer, free_port
from jenga_sglang.bench.studies.e2e_cpu import prefill_rounds
from jenga_sglang.cpu_transfer import received_bytes

_JENGA = ("--enable-jenga", "--no-jenga-pool")
_DECODE_TREE = "--disaggregation-decode-enable-radix-cache"
#: Per variant, the prefill server's flags and the decode server's.
VARIANTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "stock": ((), ()),
    # the Jenga pool on both sides: its page regions registered with the engine (the pool's
    # layouts must match, so the decode side runs it too)
    "jenga": (("--enable-jenga",), ("--enable-jenga",)),
    # our tree over SGLang's own pools, whose buffers the transfer engines register
    "jenga-no-pool": (_JENGA, ()),
    # and on the decode side too
    "jenga-both-no-pool": (_JENGA, _JENGA),
    # the decode side's own radix cache: a decode hit means its KV is not sent again (the
    # prefill side is told `decode_prefix_len`); stock's hits end at its Mamba states, ours
    # need the KV alone (the state always comes from prefill)
    "stock-decode-tree": ((), (_DECODE_TREE,)),
    "jenga-decode-tree": (("--enable-jenga",), ("--enable-jenga", _DECODE_TREE)),
}
PD_FLAGS = ("--disaggregation-transfer-backend", "mooncake", "--disable-overlap-schedule")
#: A request whose peer gave up fails after this many seconds instead of SGLang's 300.
PD_ENV = {
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "30",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "30",
}
#: A fork shares this many tokens of its session's first prompt (60 or more long).
FORK_AT = 48
#: The aborted requests' timing and sides, in turn: seconds after sending, and which servers
#: get the abort (a router whose client goes aborts both; one side alone is a peer failing).
ABORTS = ((0.0, "both"), (0.3, "prefill"), (1.0, "decode"), (2.5, "both"))
#: Serves one request: (kind, prompt) -> reply.
Ask = Callable[[str, list[int]], list[int]]


def sessions_of(count: int, seed: int) -> list[list[int]]:
    """Each session's first prompt (60-99 token ids below the tiny vocabulary's 512)."""
    rng = random.Random(seed)
    return [[rng.randrange(5, 500) for _ in range(rng.randrange(60, 100))] for _ in range(count)]


def next_prompt(prompt: list[int], reply: list[int], rng: random.Random) -> list[int]:
    return [*prompt, *reply, *(rng.randrange(5, 500) for _ in range(16))]


def load(args: argparse.Namespace, ask: Ask) -> None:
    """The requests, in order: each session's turns, then its forks (its first prompt's first
    `FORK_AT` tokens and a tail of their own; from the second fork on, a tree that kept the
    branch point hits it). `ask(kind, prompt)` serves one and returns its reply."""
    rng = random.Random(args.seed + 1)
    for first in sessions_of(args.sessions, args.seed):
        prompt = first
        for _ in range(args.turns):
            prompt = next_prompt(prompt, ask("turn", prompt), rng)
        for _ in range(args.forks):
            ask("fork", [*first[:FORK_AT], *(rng.randrange(5, 500) for _ in range(24))])


def reference(model: str, args: argparse.Namespace, out: Path) -> list[list[int]]:
    """Every request's reply from one stock server (no PD), in `load`'s order."""
    replies: list[list[int]] = []
    flags, env = _parallel(args)
    with LocalServer(
        model, [*flags, *shlex.split(args.server_flags)], log=out / "reference.log", env=env,
        ready_timeout_s=900,
    ) as server:  # fmt: skip

        def ask(kind: str, prompt: list[int]) -> list[int]:
            body = generate_body(server.url, {"input_ids": prompt, **_sampling(args)})
            replies.append(list(body["output_ids"]))
            return replies[-1]

        load(args, ask)
    return replies


def run_variant(model: str, variant: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    boot = free_port()
    tp, tp_env = _parallel(args)
    env = {**PD_ENV, **tp_env}
    prefill_flags = (
        "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot),
        *PD_FLAGS, *tp, *VARIANTS[variant][0], *shlex.split(args.server_flags),
    )  # fmt: skip
    decode_flags = (
        "--disaggregation-mode", "decode", *PD_FLAGS, *tp, *VARIANTS[variant][1],
        *shlex.split(args.server_flags),
    )  # fmt: skip
    rows: list[dict[str, Any]] = []
    logs = out / f"{variant}-prefill.log", out / f"{variant}-decode.log"
    with (
        LocalServer(model, prefill_flags, log=logs[0], env=env) as prefill,
        LocalServer(model, decode_flags, log=logs[1], env=env) as decode,
        ThreadPoolExecutor(2) as pool,
    ):
        sides = {"prefill": prefill.url, "decode": decode.url}
        aborted = [_aborted(args, i, boot, sides, pool) for i in range(args.aborts)]
        rounds_before = prefill_rounds(logs[0].read_text(errors="replace"))  # the aborted ones
        bytes_before = received_bytes(logs[1].read_text(errors="replace"))

        def ask(kind: str, prompt: list[int]) -> list[int]:
            # as SGLang's PD router does: both sides, the prefill side's bootstrap, a new room
            payload = {
                "input_ids": prompt,
                **_sampling(args),
                "bootstrap_host": "127.0.0.1",
                "bootstrap_port": boot,
                "bootstrap_room": len(rows) + 1,
            }
            both = [pool.submit(generate_body, url, payload) for url in sides.values()]
            p_body, d_body = (side.result() for side in both)
            rows.append({
                "kind": kind, "prompt": len(prompt), "reply": list(d_body["output_ids"]),
                "prefill_cached": int(p_body["meta_info"]["cached_tokens"]),
                "decode_cached": int(d_body["meta_info"]["cached_tokens"]),
            })  # fmt: skip
            return list(rows[-1]["reply"])

        load(args, ask)
        rounds = prefill_rounds(logs[0].read_text(errors="replace")) - rounds_before
        moved = received_bytes(logs[1].read_text(errors="replace")) - bytes_before
        alive = all(health(url) for url in sides.values())  # (a health check prefills too)
    texts = [log.read_text(errors="replace") for log in logs]
    return {
        "variant": variant,
        "requests": len(rows),
        "prompt_tokens": sum(r["prompt"] for r in rows),
        "prefill_cached_tokens": sum(r["prefill_cached"] for r in rows),
        "prefill_cached_per_request": [r["prefill_cached"] for r in rows],
        "decode_cached_per_request": [r["decode_cached"] for r in rows],
        "kinds": [r["kind"] for r in rows],
        "prefill_rounds": rounds,
        "decode_received_bytes": moved,
        "aborted": aborted,
        "leak_reports": sum(text.count("memory leak detected") for text in texts),
        "alive_after": alive,
        "tracebacks": sum(unexpected_tracebacks(text) for text in texts),
        "replies": [r["reply"] for r in rows],
    }


def _aborted(
    args: argparse.Namespace, i: int, boot: int, sides: dict[str, str], pool: ThreadPoolExecutor
) -> dict[str, Any]:
    """Request i of its own (300 fresh ids, 64 reply tokens, a room past the load's), aborted
    as `ABORTS` says; what each side answered (HTTP status and the start of its body)."""
    after, where = ABORTS[i % len(ABORTS)]
    rng = random.Random(args.seed + 100 + i)
    rid = f"aborted-{i}"
    payload = {
        "input_ids": [rng.randrange(5, 500) for _ in range(300)],
        "sampling_params": {"max_new_tokens": 64, "temperature": 0.0},
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": boot,
        "bootstrap_room": 10_000 + i,
        "rid": rid,
    }
    body = json.dumps(payload).encode()
    sent = {name: pool.submit(post_generate, url, body, 120.0) for name, url in sides.items()}
    time.sleep(after)
    for name, url in sides.items():
        if where in ("both", name):
            abort_request(url, rid)
    answers = {name: future.result(timeout=180) for name, future in sent.items()}
    return {
        "after_s": after,
        "aborted_on": where,
        **{name: [status, json.dumps(reply)[:120]] for name, (status, reply) in answers.items()},
    }


def _parallel(args: argparse.Namespace) -> tuple[tuple[str, ...], dict[str, str]]:
    """`--tp N` > 1: the flags and environment of N tensor-parallel ranks per server (rank i
    on core i mod the CPU count, as `scale_tp` runs them; the CPU shim turns pynccl off).
    At 1: nothing added, SGLang's defaults."""
    tp = int(getattr(args, "tp", 1))
    if tp <= 1:
        return (), {}
    cores = os.cpu_count() or 1
    bind = "|".join(str(rank % cores) for rank in range(tp))
    return ("--tp-size", str(tp)), {"SGLANG_CPU_OMP_THREADS_BIND": bind}


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    return {"sampling_params": {"max_new_tokens": args.reply_tokens, "temperature": 0.0}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jenga-bench pd-cpu", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="data/tiny-model")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--sessions", type=int, default=3)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--forks", type=int, default=2, help="per session, after its turns")
    p.add_argument("--reply-tokens", type=int, default=12)
    p.add_argument("--aborts", type=int, default=4, help="aborted requests before the load")
    p.add_argument(
        "--server-flags",
        default="",
        help="more SGLang flags for every server (the reference's too), after the study's own",
    )
    p.add_argument(
        "--tp", type=int, default=1, help="tensor-parallel ranks of every server, both sides"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/pd-cpu")
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if (
        min(args.sessions, args.turns, args.reply_tokens, args.tp) < 1
        or min(args.forks, args.aborts) < 0
    ):
        p.error(
            "--sessions, --turns, --reply-tokens and --tp must be >= 1, --forks and --aborts >= 0"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    expected = reference(args.model, args, out)
    results = []
    for variant in variants:
        result = run_variant(args.model, variant, args, out)
        result["replies_equal_reference"] = result.pop("replies") == expected
        results.append(result)
        print(json.dumps(result), flush=True)
    (out / "summary.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r["replies_equal_reference"] and not r["tracebacks"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
