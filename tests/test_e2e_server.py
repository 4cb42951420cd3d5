"""End to end on CPU: `python -m sglang.launch_server --enable-jenga` serves the tiny model.

Once per Mamba cache strategy (bench/server.py `STRATEGIES`): `no_buffer` without overlap
scheduling, and `extra_buffer` with overlap scheduling (SGLang's GPU default, which the plugin
lets SGLang take on CPU). Starts the real server on loopback, sends two chat turns of one
session through the OpenAI-compatible API (bench/online.py's client), and stops it. The second
turn repeats the first prompt with the server's reply re-rendered by the chat template, so its
cached tokens come from the real scheduler calling our backend. Then three token-id requests
through /generate check the state captured exactly at a branch point in SGLang's real
PrefillAdder and forward. About 2-3 minutes per strategy on 2 cores, most of it the start.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest

from jenga_sglang.bench.online import OnlineConfig, Turn, replay
from jenga_sglang.bench.server import LocalServer

pytestmark = pytest.mark.sglang


def _generate_cached(url: str, ids: list[int]) -> int:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    request = urllib.request.Request(
        url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=240) as reply:
        return int(json.loads(reply.read())["meta_info"]["cached_tokens"])


@pytest.mark.parametrize("strategy", ["no_buffer", "extra_buffer"])
def test_jenga_server_hits_prompts_and_branch_points(
    tiny_model: Path, tmp_path: Path, strategy: str
) -> None:
    words = "hello there cache please keep the state of this prompt for me and the next turn"
    session = [Turn(0, 0, f"{words} {words} {words}", 6), Turn(0, 1, "and now a second turn", 4)]
    log = tmp_path / "server.log"
    flags = ["--enable-jenga"]
    with LocalServer(
        str(tiny_model), flags, log=log, ready_timeout_s=420, strategy=strategy
    ) as server:
        config = OnlineConfig(url=server.url, max_requests=2, max_seconds=240, concurrency=1)
        first, second = asyncio.run(replay([session], config))
        # Branch point: b leaves a after 150 tokens, so the state at 150 is captured inside b's
        # prefill pass (no chunk cut, either strategy); c resumes from that state. Stock SGLang
        # gets 0 (no_buffer: states at prefill ends only) or 128 (extra_buffer: its 64 grid).
        a = [10 + (7 * i) % 300 for i in range(200)]
        b = a[:150] + [400 + i for i in range(50)]
        c = a[:150] + [450 + i for i in range(30)]
        cached = [_generate_cached(server.url, ids) for ids in (a, b, c)]
    text = log.read_text(errors="replace")
    assert "impl=JengaRadixCache" in text  # the scheduler built our backend
    assert "Jenga pool: " in text  # and its KV and Mamba pools are views of our one buffer
    assert f"'mamba_radix_cache_strategy': '{strategy}'" in text
    overlap = strategy == "extra_buffer"
    assert f"'disable_overlap_schedule': {not overlap}" in text
    assert first.error is None and second.error is None, (first.error, second.error)
    assert first.cached_tokens == 0
    assert first.completion_tokens >= 1 and second.completion_tokens >= 1
    # The prompt-end state, captured in the first prefill's own pass (extra_buffer too, where
    # stock SGLang would keep only its 64-token grid): the whole first prompt hits.
    assert first.prompt_tokens <= second.cached_tokens < second.prompt_tokens
    assert cached == [0, 0, 150]
