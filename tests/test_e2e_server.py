"""End to end on CPU: `python -m sglang.launch_server --enable-jenga` serves the tiny model.

Once per Mamba cache strategy (bench/drivers/server.py `STRATEGIES`): `no_buffer` without overlap
scheduling, and `extra_buffer` with overlap scheduling (SGLang's GPU default, which the plugin
lets SGLang take on CPU). Starts the real server on loopback, sends two chat turns of one
session through the OpenAI-compatible API (bench/studies/online.py's client), and stops it. The
second turn repeats the first prompt with the server's reply re-rendered by the chat template, so
its cached tokens come from the real scheduler calling our backend. Then three token-id requests
through /generate check the state captured exactly at a branch point in SGLang's real
PrefillAdder and forward. The same requests go to a stock server first (no `--enable-jenga`,
same flags and strategy): requests are sent one at a time, so the schedules are the same and the
greedy outputs must be identical. About 4-6 minutes per strategy on 2 cores, most of it the
two starts.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import NamedTuple

import pytest

from jenga_sglang.bench.drivers.server import LocalServer
from jenga_sglang.bench.studies.online import TurnResult, replay
from jenga_sglang.bench.traces.turns import OnlineConfig, Turn

pytestmark = pytest.mark.sglang


class Served(NamedTuple):
    first: TurnResult
    second: TurnResult
    branch_cached: list[int]
    branch_texts: list[str]


def _generate(url: str, ids: list[int]) -> tuple[int, str]:
    """Cached tokens and output text of a greedy 2-token /generate request."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    request = urllib.request.Request(
        url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=240) as reply:
        answer = json.loads(reply.read())
    return int(answer["meta_info"]["cached_tokens"]), str(answer["text"])


# Branch point: b leaves a after 150 tokens, so the state at 150 is captured inside b's prefill
# pass (no chunk cut, either strategy); c resumes from that state. Stock SGLang gets 0
# (no_buffer: states at prefill ends only) or 128 (extra_buffer: its 64 grid).
_A = [10 + (7 * i) % 300 for i in range(200)]
_BRANCHING = (_A, _A[:150] + [400 + i for i in range(50)], _A[:150] + [450 + i for i in range(30)])
_WORDS = "hello there cache please keep the state of this prompt for me and the next turn"
_SESSION = [Turn(0, 0, f"{_WORDS} {_WORDS} {_WORDS}", 6), Turn(0, 1, "and now a second turn", 4)]


def _serve(model: Path, flags: list[str], log: Path, strategy: str) -> Served:
    """The chat session, then the branching requests, one request at a time."""
    with LocalServer(str(model), flags, log=log, ready_timeout_s=420, strategy=strategy) as server:
        config = OnlineConfig(url=server.url, max_requests=2, max_seconds=240, concurrency=1)
        first, second = asyncio.run(replay([_SESSION], config))
        branching = [_generate(server.url, ids) for ids in _BRANCHING]
    assert first.error is None and second.error is None, (first.error, second.error)
    return Served(first, second, [c for c, _ in branching], [t for _, t in branching])


@pytest.mark.parametrize("strategy", ["no_buffer", "extra_buffer"])
def test_jenga_server_hits_prompts_and_branch_points(
    tiny_model: Path, tmp_path: Path, strategy: str
) -> None:
    stock = _serve(tiny_model, [], tmp_path / "stock.log", strategy)
    log = tmp_path / "server.log"
    jenga = _serve(tiny_model, ["--enable-jenga"], log, strategy)
    text = log.read_text(errors="replace")
    assert "impl=JengaRadixCache" in text  # the scheduler built our backend
    assert "Jenga pool: " in text  # and its KV and Mamba pools are views of our one buffer
    assert f"'mamba_radix_cache_strategy': '{strategy}'" in text
    overlap = strategy == "extra_buffer"
    assert f"'disable_overlap_schedule': {not overlap}" in text
    first, second = jenga.first, jenga.second
    assert first.cached_tokens == 0
    assert first.completion_tokens >= 1 and second.completion_tokens >= 1
    # The prompt-end state, captured in the first prefill's own pass (extra_buffer too, where
    # stock SGLang would keep only its 64-token grid): the whole first prompt hits.
    assert first.prompt_tokens <= second.cached_tokens < second.prompt_tokens
    assert jenga.branch_cached == [0, 0, 150]
    assert stock.branch_cached == ([0, 0, 128] if overlap else [0, 0, 0])
    # Same requests one at a time: the greedy outputs are stock SGLang's.
    assert (first.text, second.text) == (stock.first.text, stock.second.text)
    assert jenga.branch_texts == stock.branch_texts
