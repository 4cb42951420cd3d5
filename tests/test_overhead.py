"""`jenga-bench overhead`: both caches driven through SGLang's calls on one stream.

The stream must really exercise the trees (hits on the shared context, every request released,
nothing leaked), and the command must print one JSON object per measurement.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from jenga_sglang.bench.cli.main import main

pytestmark = pytest.mark.sglang


@pytest.mark.parametrize("cache", ["jenga", "sglang-native"])
def test_stream_hits_the_shared_context_and_releases_everything(cache: str) -> None:
    from jenga_sglang.bench.studies.overhead import NEW_TOKENS, Point, build_cache, measure, warm

    native = build_cache(cache, nodes=200, max_prompt=3000, running=4, requests=10)
    warmed: list[int] = []
    warm(native, 200, seed=1, tick=lambda: warmed.append(1))
    assert len(warmed) == 200 - 200 // 64
    hits: list[int] = []
    admit = native.admit

    def counted(inp: Any, n: int) -> Any:
        req = admit(inp, n)
        hits.append(int(req.prefix_len))
        return req

    native.admit = counted
    row = measure(native, Point(cache, 200, 3000, 4), requests=6, seed=1, tick=lambda: None)
    assert len(hits) == 4 + 6  # the running fill, then the measured ones
    # The second request finds the context's KV but no state there: it checkpoints it (ours
    # exactly at the branch point, SGLang's extra_buffer on its 64-token grid); later ones hit.
    context = 3000 - NEW_TOKENS
    want = context if cache == "jenga" else context // 64 * 64
    assert hits[:2] == [0, 0] and set(hits[2:]) == {want}, hits
    assert row.bookkeeping_ms_per_request > 0 and row.tensor_ms_per_request >= 0
    assert native.req_pool.available_size() == native.req_pool.size  # every row came back


def test_cli_json_rows_and_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "overhead",
        "--nodes",
        "100",
        "--prompt-tokens",
        "512",
        "--running",
        "2",
        "--repeats",
        "1",
    ]
    assert main([*argv, "--requests", "3", "--json", "--no-progress"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["cache"] for r in rows] == ["jenga", "sglang-native"]
    keys = {"cache", "nodes", "prompt_tokens", "running", "bookkeeping_ms_per_request",
            "tensor_ms_per_request"}  # fmt: skip
    assert all(set(r) == keys and r["nodes"] == 100 and r["running"] == 2 for r in rows)
    assert main([*argv, "--caches", "vllm", "--no-progress"]) == 2
    assert "caches must be of" in capsys.readouterr().err
