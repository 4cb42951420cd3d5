"""End to end on CPU: `--enable-session-radix-cache` in SGLang's real scheduler, stock and with
`--enable-jenga` (binding/cache/sessions.py; the tiny NemotronH of tests/test_e2e_server.py).

Per server: /open_session, three turns of the session through /generate with its `session_id`
(each turn the whole history plus a new message), a request outside the session that parts
from its history after 150 tokens, then /close_session and one more request. SGLang's strict
idle check runs between requests, with the session's path locked and after the close. The
greedy outputs must equal stock's and our hits must be at least stock's. About 2 minutes.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from jenga_sglang.bench.drivers.server import LocalServer
from tests.test_e2e_namespaces import MESSAGE, PROMPT, Reply

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

SESSIONS = "--enable-session-radix-cache"


def _post(url: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=240) as reply:
        text = reply.read()
    return json.loads(text) if text else None


def _generate(url: str, ids: list[int], session: str | None) -> Reply:
    body: dict[str, Any] = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0},
    }
    if session is not None:
        body["session_id"] = session
    answer = _post(url, "/generate", body)
    return Reply(int(answer["meta_info"]["cached_tokens"]), [int(t) for t in answer["output_ids"]])


def serve(model: Path, flags: list[str], log: Path) -> list[Reply]:
    replies: list[Reply] = []
    with LocalServer(str(model), [SESSIONS, *flags], log=log, ready_timeout_s=420) as server:
        url = server.url
        assert _post(url, "/open_session", {"capacity_of_str_len": 1 << 20, "session_id": "s"})
        history = list(PROMPT)
        for turn in range(3):
            reply = _generate(url, history, "s")
            replies.append(reply)
            history += reply.output + [m + turn for m in MESSAGE]
        replies.append(_generate(url, PROMPT[:150] + [450 + i for i in range(30)], None))
        _post(url, "/close_session", {"session_id": "s"})
        replies.append(_generate(url, history, None))
    return replies


def test_radix_sessions_serve_as_stock_with_our_tree(tiny_model: Path, tmp_path: Path) -> None:
    stock = serve(tiny_model, [], tmp_path / "stock.log")
    jenga = serve(tiny_model, ["--enable-jenga"], tmp_path / "jenga.log")
    assert "impl=JengaRadixCache" in (tmp_path / "jenga.log").read_text(errors="replace")
    print(json.dumps({"stock": stock, "jenga": jenga}))
    assert [r.output for r in jenga] == [r.output for r in stock]
    assert all(j.cached >= s.cached for j, s in zip(jenga, stock, strict=True))
    assert 0 < jenga[1].cached < jenga[2].cached  # each turn resumes from the last
