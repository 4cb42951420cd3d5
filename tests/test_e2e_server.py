"""End to end on CPU: `python -m sglang.launch_server --enable-jenga` serves the tiny model.

Starts the real server on loopback (bench/server.py), sends two chat turns of one session
through the OpenAI-compatible API (bench/online.py's client), and stops it. The second turn
repeats the first prompt with the server's reply re-rendered by the chat template, so its
cached tokens come from the real scheduler calling our backend: the prompt-end state and its
KV. About 2 minutes on 2 cores, most of it the server's start.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
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


def test_second_turn_hits_the_jenga_cache(tiny_model: Path, tmp_path: Path) -> None:
    session = [
        Turn(0, 0, "hello there cache please keep the state of this prompt for me", 6),
        Turn(0, 1, "and now the second turn of the same conversation", 4),
    ]
    log = tmp_path / "server.log"
    with LocalServer(str(tiny_model), ["--enable-jenga"], log=log, ready_timeout_s=420) as server:
        config = OnlineConfig(url=server.url, max_requests=2, max_seconds=240, concurrency=1)
        first, second = asyncio.run(replay([session], config))
    text = log.read_text(errors="replace")
    assert "impl=JengaRadixCache" in text  # the scheduler built our backend
    assert first.error is None and second.error is None, (first.error, second.error)
    assert first.cached_tokens == 0
    assert 0 < second.cached_tokens < second.prompt_tokens
    assert second.cached_tokens >= first.prompt_tokens  # the whole first prompt
    assert first.completion_tokens >= 1 and second.completion_tokens >= 1
