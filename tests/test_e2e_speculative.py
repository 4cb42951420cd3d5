"""End to end on CPU: NGRAM speculative decoding over the Jenga pool against stock SGLang.

Both servers serve the tiny NemotronH with `--speculative-algorithm NGRAM` (a chain of 3 drafts
per verify: `--speculative-ngram-max-bfs-breadth 1`), the Triton attention backend (it runs the
verify forward's draft mask; torch_native cannot) and the speculative stand-ins of the CPU
interpreter mode (jenga_sglang/cpu_speculative.py, both servers). Stock uses SGLang's own cache
and pools; ours `--enable-jenga` with the Jenga pool (the verify scratch beside it). The same
token-id requests go one at a time to each:

1. a prompt `A`; 2. `A` again: NGRAM's corpus now holds A's reply, so its drafts are accepted;
3. `B` = A[:100] + other tokens; 4. `C` = A[:100] + others again; 5. A's next turn.

Checked: identical greedy outputs and acceptance (proposed and accepted drafts) request by
request; jenga's cached tokens at least stock's on each, and on `C` the branch point's state,
captured inside `B`'s prefill, where stock has none. About 4 minutes on 2 cores.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from jenga_sglang.bench.drivers.server import LocalServer

pytestmark = pytest.mark.sglang

NGRAM = [
    "--speculative-algorithm", "NGRAM",
    "--speculative-num-draft-tokens", "4",
    "--speculative-ngram-max-bfs-breadth", "1",
    "--attention-backend", "triton",
    "--max-running-requests", "4",
    "--mem-fraction-static", "0.3",  # SGLang's start-up check counts the verify scratch
]  # fmt: skip
OUT = 12  # tokens per reply
_A = [10 + (7 * i) % 300 for i in range(150)]
_B = _A[:100] + [400 + i for i in range(30)]
_C = _A[:100] + [450 + i for i in range(20)]


def _generate(url: str, ids: list[int]) -> dict[str, Any]:
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": OUT, "temperature": 0, "ignore_eos": True},
    }
    request = urllib.request.Request(
        url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as reply:
        answer: dict[str, Any] = json.loads(reply.read())
    return answer


def _serve(model: Path, flags: list[str], log: Path) -> list[dict[str, Any]]:
    with LocalServer(str(model), [*NGRAM, *flags], log=log, ready_timeout_s=420) as server:
        first = _generate(server.url, _A)
        answers = [first, _generate(server.url, _A), _generate(server.url, _B)]
        answers.append(_generate(server.url, _C))
        answers.append(_generate(server.url, _A + first["output_ids"] + [7, 8, 9, 10]))
    return answers


def _acceptance(answer: dict[str, Any]) -> tuple[int, int, int]:
    meta = answer["meta_info"]
    return meta["spec_verify_ct"], meta["spec_num_proposed_drafts"], meta["spec_num_correct_drafts"]


def test_ngram_over_the_jenga_pool_matches_stock_and_hits_more(
    tiny_model: Path, tmp_path: Path
) -> None:
    stock = _serve(tiny_model, [], tmp_path / "stock.log")
    log = tmp_path / "jenga.log"
    jenga = _serve(tiny_model, ["--enable-jenga"], log)
    text = log.read_text(errors="replace")
    assert "impl=JengaRadixCache" in text and "Jenga pool: " in text
    assert [a["output_ids"] for a in jenga] == [a["output_ids"] for a in stock]
    assert [_acceptance(a) for a in jenga] == [_acceptance(a) for a in stock]
    assert _acceptance(jenga[1])[2] > 0  # the repeat's drafts were accepted
    cached = [a["meta_info"]["cached_tokens"] for a in jenga]
    stock_cached = [a["meta_info"]["cached_tokens"] for a in stock]
    assert all(ours >= theirs for ours, theirs in zip(cached, stock_cached, strict=True))
    assert (cached[3], stock_cached[3]) == (100, 0)  # the branch point, captured in B's pass
    assert cached[4] >= len(_A) + OUT - 1  # the first turn's reply, verified, then cached
