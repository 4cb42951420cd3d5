"""End to end on CPU: `cache_salt` namespaces in SGLang's real scheduler, stock and with
`--enable-jenga` (bench/drivers/server.py, the tiny NemotronH of tests/test_e2e_server.py).

Through /generate, one request at a time: the same prompt under salts "a" and "b" (nothing
shared across: 0 cached tokens), then each salt's second turn (its prompt, the server's reply
and a new message: cached tokens from its own first turn), then that second turn under a third
salt and under none (0 again), then each salt's third turn, whose history carries the second
reply re-rendered (other tokens, as a chat template may render it), so it leaves the second
turn's sequence at its prompt's end. Last, per salt, three requests that part after a
shared 150-token prefix (tests/test_e2e_server.py's branch point: ours captures the state at
150 and the third request hits it, stock SGLang's no_buffer keeps states at prefill ends
only). The two servers get the same requests, so their greedy outputs and the per-salt hits
compare directly: ours must hit at least what stock SGLang hits. About 2-3 minutes on 2 cores,
most of it the two starts.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from jenga_sglang.bench.drivers.server import LocalServer

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PROMPT = [10 + (7 * i) % 300 for i in range(200)]
MESSAGE = [400 + i for i in range(40)]  # the second turn's new message
RERENDERED = [500, 501, 502]  # the second reply as the third turn's history renders it
_B = [20 + (11 * i) % 350 for i in range(200)]
BRANCHING = (_B, _B[:150] + [400 + i for i in range(50)], _B[:150] + [450 + i for i in range(30)])


class Reply(NamedTuple):
    cached: int
    output: list[int]


def post(url: str, path: str, body: dict[str, Any]) -> Any:
    """POST `body` as JSON to the server's `path`; its JSON reply (None when empty)."""
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=240) as reply:
        text = reply.read()
    return json.loads(text) if text else None


def generate(url: str, ids: list[int], salt: str | None, **fields: Any) -> Reply:
    """Cached tokens and output ids of a greedy 4-token /generate request under `salt`
    (`fields`: more of the request's fields, e.g. `session_id`)."""
    body: dict[str, Any] = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0},
        **fields,
    }
    if salt is not None:
        body["cache_salt"] = salt
    answer = post(url, "/generate", body)
    return Reply(int(answer["meta_info"]["cached_tokens"]), [int(t) for t in answer["output_ids"]])


def serve_salted(model: Path, flags: list[str], log: Path) -> dict[str, Reply]:
    """The salted session on one server; replies by step name."""
    out: dict[str, Reply] = {}
    with LocalServer(str(model), flags, log=log, ready_timeout_s=420) as server:
        for salt in ("a", "b"):
            out[f"first-{salt}"] = generate(server.url, PROMPT, salt)
        for salt in ("a", "b"):
            turn2 = PROMPT + out[f"first-{salt}"].output + MESSAGE
            out[f"second-{salt}"] = generate(server.url, turn2, salt)
        turn2 = PROMPT + out["first-a"].output + MESSAGE
        out["second-c"] = generate(server.url, turn2, "c")
        out["second-none"] = generate(server.url, turn2, None)
        for salt in ("a", "b"):
            turn3 = PROMPT + out[f"first-{salt}"].output + MESSAGE + RERENDERED + MESSAGE[:8]
            out[f"third-{salt}"] = generate(server.url, turn3, salt)
        for salt in ("a", "b"):
            for i, ids in enumerate(BRANCHING):
                out[f"branch-{salt}-{i}"] = generate(server.url, ids, salt)
    return out


def test_cache_salts_share_within_and_never_across(tiny_model: Path, tmp_path: Path) -> None:
    stock = serve_salted(tiny_model, [], tmp_path / "stock.log")
    jenga = serve_salted(tiny_model, ["--enable-jenga"], tmp_path / "jenga.log")
    assert "impl=JengaRadixCache" in (tmp_path / "jenga.log").read_text(errors="replace")
    print(json.dumps({"stock": stock, "jenga": jenga}, default=list))  # the RESULTS numbers
    for name, run in (("stock", stock), ("jenga", jenga)):
        assert run["first-a"].cached == run["first-b"].cached == 0, name  # never across salts
        assert run["second-c"].cached == run["second-none"].cached == 0, name
        for salt in ("a", "b"):
            assert run[f"second-{salt}"].cached > 0, (name, salt)  # hits within its salt
            assert run[f"third-{salt}"].cached >= run[f"second-{salt}"].cached, (name, salt)
        for salt in ("a", "b"):  # b's first request: nothing of a's
            assert [run[f"branch-{salt}-{i}"].cached for i in (0, 1)] == [0, 0], (name, salt)
    for step in stock:
        assert jenga[step].cached >= stock[step].cached, step
    assert jenga["branch-a-2"].cached == jenga["branch-b-2"].cached == 150
    assert {k: r.output for k, r in jenga.items()} == {k: r.output for k, r in stock.items()}
