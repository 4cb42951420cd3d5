"""SGLang's own `bench_serving` against the tiny model served on CPU, stock and `--enable-jenga`.

    PYTHONPATH=$PWD .venv/bin/python -m jenga_sglang.bench.studies.bench_serving_cpu \
        --model data/tiny-model --out out/bench-serving.json

For each Mamba strategy (bench/drivers/server.py `STRATEGIES`) and each server of `--servers`
(stock, `--enable-jenga`, `--enable-jenga --no-jenga-pool`; `--server-flags` and `--server-env`
add to all of them, e.g. gpt-oss's `--attention-backend triton` and a small
`--max-total-tokens`), it starts a server (bench/drivers/server.py `LocalServer`), runs
`python -m sglang.bench_serving` offline (`HF_HUB_OFFLINE=1`, the tiny model's tokenizer) on
`--dataset-name generated-shared-prefix`
(4 groups x 4 prompts, a 200-token system prompt, 32-token questions, 16 output tokens,
concurrency 4) and reads back bench_serving's own JSON line (TTFT, input throughput) and the
server log's prefill lines (cached tokens, prefill rounds). bench_serving reports no cached
tokens itself; the server's `#cached-token` sum is the same count its usage reports.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from jenga_sglang.bench.drivers.server import STRATEGIES, LocalServer

GSP_ARGS: tuple[str, ...] = (
    "--backend", "sglang",
    "--dataset-name", "generated-shared-prefix",
    "--gsp-num-groups", "4",
    "--gsp-prompts-per-group", "4",
    "--gsp-system-prompt-len", "200",
    "--gsp-question-len", "32",
    "--gsp-output-len", "16",
    "--max-concurrency", "4",
    "--seed", "1",
    "--warmup-requests", "0",
    "--disable-tqdm",
)  # fmt: skip
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
_PREFILL = re.compile(r"Prefill batch, #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)")


def bench_serving_argv(url: str, model: str, out_file: Path, extra: tuple[str, ...]) -> list[str]:
    """The exact `bench_serving` command line (docs/e2e-cpu.md quotes it)."""
    return [
        sys.executable, "-m", "sglang.bench_serving", "--base-url", url,
        "--model", model, "--tokenizer", model, *extra, "--output-file", str(out_file),
    ]  # fmt: skip


def prefill_figures(log_text: str) -> dict[str, int]:
    """Prefill rounds and the new / cached token sums from SGLang's "Prefill batch" lines."""
    rounds = new = cached = 0
    for _, n, c in _PREFILL.findall(log_text):
        rounds, new, cached = rounds + 1, new + int(n), cached + int(c)
    return {"prefill_rounds": rounds, "new_tokens": new, "cached_tokens": cached}


#: The servers a run compares: stock SGLang, ours, and ours on SGLang's own pools.
SERVERS: dict[str, tuple[str, ...]] = {
    "stock": (),
    "jenga": ("--enable-jenga",),
    "jenga-no-pool": ("--enable-jenga", "--no-jenga-pool"),
}


def run_one(
    model: str,
    strategy: str,
    server_name: str,
    work: Path,
    extra_flags: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    name = f"{strategy}-{server_name}"
    log, out_file = work / f"server-{name}.log", work / f"gsp-{name}.jsonl"
    out_file.unlink(missing_ok=True)
    flags = [*SERVERS[server_name], *extra_flags]
    with LocalServer(
        model, flags, log=log, ready_timeout_s=420, strategy=strategy, env=env
    ) as server:
        argv = bench_serving_argv(server.url, model, out_file, GSP_ARGS)
        client_env = dict(os.environ, **OFFLINE_ENV)
        subprocess.run(argv, env=client_env, check=True, timeout=900, stdout=subprocess.DEVNULL)
    line = json.loads(out_file.read_text().splitlines()[-1])
    return {
        "strategy": strategy,
        "server": server_name,
        "completed": line["completed"],
        "mean_ttft_ms": round(line["mean_ttft_ms"], 1),
        "p99_ttft_ms": round(line["p99_ttft_ms"], 1),
        "input_tok_s": round(line["input_throughput"], 1),
        "duration_s": round(line["duration"], 1),
        **prefill_figures(log.read_text(errors="replace")),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="data/tiny-model")
    p.add_argument("--out", default="out/bench-serving.json")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--servers", default="stock,jenga", help=f"of {', '.join(SERVERS)}")
    p.add_argument(
        "--server-flags", default="", help="more server flags for every server (one string)"
    )
    p.add_argument("--server-env", default="", help="NAME=VALUE,... in every server's environment")
    args = p.parse_args(argv)
    servers = [s for s in args.servers.split(",") if s]
    strategies = [s for s in args.strategies.split(",") if s]
    bad = sorted(set(servers) - set(SERVERS)) + sorted(set(strategies) - set(STRATEGIES))
    env = dict(kv.split("=", 1) for kv in args.server_env.split(",") if "=" in kv)
    if bad or not servers or not strategies:
        p.error(f"unknown servers or strategies: {bad or 'none given'}")
    work = Path(args.out).parent / "bench-serving"
    work.mkdir(parents=True, exist_ok=True)
    extra = tuple(args.server_flags.split())
    rows = []
    for strategy in strategies:
        for server in servers:
            rows.append(run_one(args.model, strategy, server, work, extra, env))
            print(json.dumps(rows[-1]), flush=True)
    record = {"gsp_args": GSP_ARGS, "server_flags": extra, "server_env": env, "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
