"""End to end on CPU: `--enable-int8-mamba-checkpoint` in SGLang's real scheduler, stock and
with `--enable-jenga` on the Jenga pool (the tiny NemotronH of tests/test_e2e_server.py).

One request at a time: a 200-token prompt, its second and third turns (hits on the prompt
end), then three requests that part after a shared 150-token prefix (ours captures the state
at 150 in-pass; stock's no_buffer keeps states at prefill ends only). Both servers quantize
the states they cache with SGLang's own int8 quantizer and resume a hit from its dequantized
copy, so the greedy outputs must be equal, and ours must hit at least what stock hits. SGLang's
idle leak check (strict by default) checks the live pool and the int8 pool apart after each
request. About 2-3 minutes on 2 cores, most of it the two starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jenga_sglang.bench.drivers.server import LocalServer
from tests.test_e2e_namespaces import BRANCHING, MESSAGE, PROMPT, Reply, generate

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

INT8 = "--enable-int8-mamba-checkpoint"


def serve(model: Path, flags: list[str], log: Path) -> list[Reply]:
    replies: list[Reply] = []
    with LocalServer(str(model), [INT8, *flags], log=log, ready_timeout_s=420) as server:
        first = generate(server.url, PROMPT, None)
        second_ids = PROMPT + first.output + MESSAGE
        second = generate(server.url, second_ids, None)
        third = generate(server.url, second_ids + second.output + MESSAGE[:8], None)
        replies += [first, second, third]
        replies += [generate(server.url, ids, None) for ids in BRANCHING]
    return replies


def test_int8_checkpoints_serve_as_stock_with_more_hits(tiny_model: Path, tmp_path: Path) -> None:
    stock = serve(tiny_model, [], tmp_path / "stock.log")
    jenga = serve(tiny_model, ["--enable-jenga"], tmp_path / "jenga.log")
    log = (tmp_path / "jenga.log").read_text(errors="replace")
    assert "impl=JengaRadixCache" in log and "int8 mamba checkpoint pool:" in log
    assert "Jenga pool:" in log  # the default pool, with SGLang's int8 pool beside it
    print(json.dumps({"stock": stock, "jenga": jenga}))  # the RESULTS numbers
    assert [r.output for r in jenga] == [r.output for r in stock]
    assert all(j.cached >= s.cached for j, s in zip(jenga, stock, strict=True))
    assert stock[1].cached > 0 and stock[2].cached > stock[1].cached  # turns hit in both
    assert jenga[-1].cached == 150 and stock[-1].cached == 0  # ours: the in-pass branch point
