"""Does stock SGLang agree with itself under concurrent load, and Jenga with stock?

    PYTHONPATH=$PWD .venv/bin/python scripts/determinism_cpu.py --runs stock,stock,jenga

Serves the tiny model once per run (bench/drivers/server.py, `no_buffer`), replays the same load at
concurrency 8 with greedy decoding (bench/studies/online.py): 8 two-turn chat sessions (`--load
sessions`) or bench/studies/e2e_cpu.py's chat8 load (`--load chat8`: 24 requests sharing a 150-word
system prompt), and compares every completion of each run with the first run's: how many
differ, and at which character.
`--extra` flags go to every server (e.g. `--enable-deterministic-inference`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from jenga_sglang.bench.drivers.server import LocalServer
from jenga_sglang.bench.studies.online import replay
from jenga_sglang.bench.traces.turns import WORDS, OnlineConfig, Turn, sessions_from_trace


def sessions(n: int = 8) -> list[list[Turn]]:
    def words(seed: int, k: int) -> str:
        return " ".join(WORDS[(seed * 7 + 3 * i) % len(WORDS)] for i in range(k))

    return [[Turn(s, 0, words(s, 40), 16), Turn(s, 1, words(100 + s, 12), 16)] for s in range(n)]


def chat8_sessions(cache_dir: Path) -> list[list[Turn]]:
    """bench/studies/e2e_cpu.py's chat8 load: 24 single-turn requests sharing a 150-word
    system prompt."""
    from jenga_sglang.bench.studies.e2e_cpu import CHAT8, chat8_config
    from jenga_sglang.bench.traces.build import cached_trace

    trace = cached_trace("system-chat", CHAT8, cache_dir)
    config = chat8_config(OnlineConfig("http://127.0.0.1:1"), "http://127.0.0.1:1")
    return sessions_from_trace(str(trace), config)


def run_once(
    model: str, jenga: bool, extra: list[str], log: Path, load: list[list[Turn]]
) -> dict[str, str]:
    flags = (["--enable-jenga"] if jenga else []) + extra
    with LocalServer(model, flags, log=log, ready_timeout_s=420) as server:
        config = OnlineConfig(
            server.url,
            max_requests=sum(map(len, load)),
            max_seconds=400,
            concurrency=8,
            max_user_words=200,
        )
        results = asyncio.run(replay(load, config))
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{log}: {errors[:3]}")
    return {f"{r.session_id}/{r.turn_index}": r.text for r in results}


def first_diff(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="data/tiny-model")
    p.add_argument("--runs", default="stock,stock,jenga")
    p.add_argument("--extra", default="", help="flags for every server, space separated")
    p.add_argument("--out", default="out/determinism.json")
    p.add_argument("--load", choices=("sessions", "chat8"), default="sessions")
    args = p.parse_args()
    extra = args.extra.split()
    load = sessions() if args.load == "sessions" else chat8_sessions(Path("out/traces"))
    outputs = []
    for i, kind in enumerate(args.runs.split(",")):
        log = Path(args.out).with_suffix(f".{i}-{kind}.log")
        outputs.append((kind, run_once(args.model, kind == "jenga", extra, log, load)))
        print(f"run {i} ({kind}) done", flush=True)
    base = outputs[0][1]
    report = {
        "load": args.load,
        "extra": extra,
        "runs": [k for k, _ in outputs],
        "versus_run_0": [],
    }
    for i, (kind, out) in enumerate(outputs[1:], start=1):
        differ = {k: first_diff(base[k], out[k]) for k in base if base[k] != out[k]}
        report["versus_run_0"].append(
            {"run": i, "kind": kind, "compared": len(base), "differ": len(differ), "at": differ}
        )
    report["outputs"] = {f"{i}-{k}": o for i, (k, o) in enumerate(outputs)}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report["versus_run_0"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
