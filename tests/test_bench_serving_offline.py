"""SGLang's own `bench_serving` runs offline against the `--enable-jenga` server (docs/e2e-cpu.md).

One server, two small bench_serving runs with the tiny model's tokenizer and no network
(`HF_HUB_OFFLINE=1`): `generated-shared-prefix` (2 groups x 2 prompts) and `agentic-trace` on a
file `jenga-bench online --write-agentic-trace` wrote. Every request must complete, and the
shared-prefix run must hit the cache. About 1.5 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from jenga_sglang.bench.drivers.server import LocalServer
from jenga_sglang.bench.studies.bench_serving_cpu import (
    OFFLINE_ENV,
    bench_serving_argv,
    prefill_figures,
)
from jenga_sglang.bench.traces.agentic_trace import write_agentic_trace
from jenga_sglang.bench.traces.trace import Request, write_trace
from jenga_sglang.bench.traces.turns import OnlineConfig

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

GSP = (
    "--backend", "sglang", "--dataset-name", "generated-shared-prefix",
    "--gsp-num-groups", "2", "--gsp-prompts-per-group", "2", "--gsp-system-prompt-len", "120",
    "--gsp-question-len", "16", "--gsp-output-len", "4", "--max-concurrency", "2",
    "--seed", "1", "--warmup-requests", "0", "--disable-tqdm",
)  # fmt: skip
AGENTIC = (
    "--backend", "sglang-oai-chat", "--dataset-name", "agentic-trace",
    "--num-prompts", "2", "--sharegpt-output-len", "4", "--max-concurrency", "2",
    "--seed", "1", "--warmup-requests", "0", "--disable-tqdm",
)  # fmt: skip


def _agentic_file(tmp_path: Path) -> Path:
    reqs: list[Request] = []
    history: dict[int, list[int]] = {0: [], 1: []}
    for t in range(2):
        for s in range(2):
            inp = history[s] + [20 + 50 * s + 7 * t + i for i in range(10)]
            reqs.append(Request(s, t, float(2 * t + s), inp, [5, 6, 7]))
            history[s] = [*inp, 5, 6, 7]
    write_trace(tmp_path / "chat.jsonl", reqs)
    out = tmp_path / "agentic.json"
    write_agentic_trace(tmp_path / "chat.jsonl", out, OnlineConfig("http://127.0.0.1:1"))
    return out


def test_bench_serving_offline(tiny_model: Path, tmp_path: Path) -> None:
    log, model = tmp_path / "server.log", str(tiny_model)
    agentic = _agentic_file(tmp_path)
    env = dict(os.environ, **OFFLINE_ENV)
    with LocalServer(model, ["--enable-jenga"], log=log, ready_timeout_s=420) as server:
        for name, extra in (("gsp", GSP), ("agentic", (*AGENTIC, "--dataset-path", str(agentic)))):
            out = tmp_path / f"{name}.jsonl"
            argv = bench_serving_argv(server.url, model, out, extra)
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=400)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
            line = json.loads(out.read_text().splitlines()[-1])
            assert line["completed"] == 4, (name, line["completed"])
    assert prefill_figures(log.read_text(errors="replace"))["cached_tokens"] > 0
