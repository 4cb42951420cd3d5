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
from pathlib import Path

import pytest

from jenga_sglang.bench.drivers.server import LocalServer
from tests.test_e2e_namespaces import MESSAGE, PROMPT, Reply, generate, post

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

SESSIONS = "--enable-session-radix-cache"


def serve(model: Path, flags: list[str], log: Path) -> list[Reply]:
    replies: list[Reply] = []
    with LocalServer(str(model), [SESSIONS, *flags], log=log, ready_timeout_s=420) as server:
        url = server.url
        assert post(url, "/open_session", {"capacity_of_str_len": 1 << 20, "session_id": "s"})
        history = list(PROMPT)
        for turn in range(3):
            reply = generate(url, history, None, session_id="s")
            replies.append(reply)
            history += reply.output + [m + turn for m in MESSAGE]
        replies.append(generate(url, PROMPT[:150] + [450 + i for i in range(30)], None))
        post(url, "/close_session", {"session_id": "s"})
        replies.append(generate(url, history, None))
    return replies


def test_radix_sessions_serve_as_stock_with_our_tree(tiny_model: Path, tmp_path: Path) -> None:
    stock = serve(tiny_model, [], tmp_path / "stock.log")
    jenga = serve(tiny_model, ["--enable-jenga"], tmp_path / "jenga.log")
    assert "impl=JengaRadixCache" in (tmp_path / "jenga.log").read_text(errors="replace")
    print(json.dumps({"stock": stock, "jenga": jenga}))
    assert [r.output for r in jenga] == [r.output for r in stock]
    assert all(j.cached >= s.cached for j, s in zip(jenga, stock, strict=True))
    assert 0 < jenga[1].cached < jenga[2].cached  # each turn resumes from the last
