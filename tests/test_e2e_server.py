"""End to end on CPU: `python -m sglang.launch_server --enable-jenga` serves the tiny model.

Starts the real server on loopback (bench/server.py), sends two chat turns of one session
through the OpenAI-compatible API (bench/online.py's client), and stops it. The second turn
repeats the first prompt with the server's reply re-rendered by the chat template, so its
cached tokens come from the real scheduler calling our backend: the prompt-end state and its
KV. Then three token-id requests through /generate check the chunk cut at a branch point in
SGLang's real PrefillAdder. About 3 minutes on 2 cores, most of it the server's start.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from jenga_sglang.bench.online import OnlineConfig, Turn, replay
from jenga_sglang.bench.server import LocalServer

pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("e2e") / "tiny-model"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), "--out", str(out)],
        check=True,
        env=env,
        timeout=300,
    )
    return out


def _generate_cached(url: str, ids: list[int]) -> int:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    request = urllib.request.Request(
        url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=240) as reply:
        return int(json.loads(reply.read())["meta_info"]["cached_tokens"])


def test_jenga_server_hits_prompts_and_branch_points(tiny_model: Path, tmp_path: Path) -> None:
    session = [
        Turn(0, 0, "hello there cache please keep the state of this prompt for me", 6),
        Turn(0, 1, "and now the second turn of the same conversation", 4),
    ]
    log = tmp_path / "server.log"
    with LocalServer(str(tiny_model), ["--enable-jenga"], log=log, ready_timeout_s=420) as server:
        config = OnlineConfig(url=server.url, max_requests=2, max_seconds=240, concurrency=1)
        first, second = asyncio.run(replay([session], config))
        # Branch point: b leaves a after 70 tokens, so its prefill is cut there and the state
        # at 70 is kept; c shares the same 70 tokens and resumes from that state.
        a = [10 + (7 * i) % 300 for i in range(100)]
        b = a[:70] + [400 + i for i in range(30)]
        c = a[:70] + [450 + i for i in range(20)]
        cached = [_generate_cached(server.url, ids) for ids in (a, b, c)]
    text = log.read_text(errors="replace")
    assert "impl=JengaRadixCache" in text  # the scheduler built our backend
    assert "Jenga pool: " in text  # and its KV and Mamba pools are views of our one buffer
    assert first.error is None and second.error is None, (first.error, second.error)
    assert first.cached_tokens == 0
    assert 0 < second.cached_tokens < second.prompt_tokens
    assert second.cached_tokens >= first.prompt_tokens  # the whole first prompt
    assert first.completion_tokens >= 1 and second.completion_tokens >= 1
    assert cached == [0, 0, 70]
