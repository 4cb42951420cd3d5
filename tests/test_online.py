"""jenga-bench online: the real client against a small OpenAI-compatible peer on 127.0.0.1.

The peer (aiohttp, in a background thread) stands in for the network server only: it streams a
deterministic reply word by word and reports as ``cached_tokens`` the longest word prefix of the
prompt it has seen before, so the client's history handling shows in the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from jenga_sglang.bench.cli.online import add_online_parser
from jenga_sglang.bench.studies.online import run_online
from jenga_sglang.bench.traces.trace import Request, write_trace
from jenga_sglang.bench.traces.turns import (
    WORDS,
    OnlineConfig,
    sessions_from_trace,
    words_for,
)

MODEL = "fake-tiny"


@dataclass
class Peer:
    """What the fake server received, and how it behaves."""

    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    seen: list[list[str]] = field(default_factory=list)
    first_chunk_delay: float = 0.02
    status: int = 200
    sessions: list[tuple[str, str]] = field(default_factory=list)  # ("open" | "close", id)


def _prompt_words(messages: list[dict[str, str]]) -> list[str]:
    out: list[str] = []
    for m in messages:
        out += [f"<{m['role']}>", *m["content"].split()]
    return out


def _cached(peer: Peer, words: list[str]) -> int:
    best = 0
    for old in peer.seen:
        n = 0
        while n < min(len(old), len(words)) and old[n] == words[n]:
            n += 1
        best = max(best, n)
    return best


def _chunk(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _app(peer: Peer) -> web.Application:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        peer.bodies.append(body)
        if peer.status != 200:
            return web.json_response({"error": "boom"}, status=peer.status)
        words = _prompt_words(body["messages"])
        cached = _cached(peer, words)
        reply = [f"r{len(peer.bodies)}w{i}" for i in range(body["max_tokens"])]
        peer.seen.append([*words, "<assistant>", *reply])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(peer.first_chunk_delay)
        for i, w in enumerate(reply):
            piece = w if i == 0 else " " + w
            await resp.write(_chunk({"choices": [{"index": 0, "delta": {"content": piece}}]}))
        usage = {
            "prompt_tokens": len(words),
            "completion_tokens": len(reply),
            "total_tokens": len(words) + len(reply),
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        await resp.write(_chunk({"choices": [], "usage": usage}))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def session_route(kind: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            body = await request.json()
            peer.sessions.append((kind, body["session_id"]))
            return web.json_response(body["session_id"] if kind == "open" else None)

        return handle

    app = web.Application()
    app.router.add_post("/open_session", session_route("open"))
    app.router.add_post("/close_session", session_route("close"))
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.fixture
def peer() -> Iterator[Peer]:
    state = Peer()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_app(state))
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    state.url = f"http://127.0.0.1:{port}"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield state
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    loop.run_until_complete(runner.cleanup())
    loop.close()


def _trace(path: Path, sessions: int = 2, turns: int = 3) -> Path:
    """Sessions whose every turn resends the history (input + output) and adds 5 new ids."""
    reqs = []
    history: dict[int, list[int]] = {s: [] for s in range(sessions)}
    for t in range(turns):
        for s in range(sessions):
            new = [100 * s + 10 * t + i for i in range(5)]
            inp = history[s] + new
            out = [7, 8, 9]
            reqs.append(Request(s, t, float(t * sessions + s), inp, out))
            history[s] = inp + out
    write_trace(path, reqs)
    return path


def test_user_text_is_the_new_ids_of_each_turn(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl")
    sessions = sessions_from_trace(str(trace), OnlineConfig("http://x", max_output_tokens=2))
    assert [len(s) for s in sessions] == [3, 3]
    second = sessions[1][1]  # session 1, turn 1: new ids 110..114
    assert second.user_text == words_for([110, 111, 112, 113, 114], 100)
    assert second.max_tokens == 2  # the trace's 3 output tokens, capped
    assert words_for([0, len(WORDS)], 10) == f"{WORDS[0]} {WORDS[0]}"
    assert words_for([], 10) == WORDS[0]


def test_replay_keeps_history_and_reports_cached_tokens(tmp_path: Path, peer: Peer) -> None:
    trace = _trace(tmp_path / "t.jsonl")
    summary = run_online(str(trace), OnlineConfig(peer.url, concurrency=2, max_output_tokens=3))
    assert summary["requests"] == 6 and summary["errors"] == 0 and summary["sessions"] == 2
    for body in peer.bodies:
        assert body["temperature"] == 0.0 and body["stream"] is True
        assert body["model"] == MODEL
    # The third turn carries both earlier user messages and the server's own two replies.
    third = [b for b in peer.bodies if len(b["messages"]) == 5]
    assert len(third) == 2
    replies = [m["content"] for m in third[0]["messages"] if m["role"] == "assistant"]
    assert all(r.startswith("r") and len(r.split()) == 3 for r in replies)
    turns = {t["turn"]: t for t in summary["per_turn"]}
    # First turns share at most the "<user>" marker with another session's first turn.
    assert turns[0]["cached_tokens"] <= 1
    assert turns[1]["cached_tokens"] > 0 and turns[2]["cached_tokens"] > turns[1]["cached_tokens"]
    for rec in summary["records"]:
        assert rec["ttft_s"] >= peer.first_chunk_delay
        assert rec["latency_s"] >= rec["ttft_s"]
        assert rec["completion_tokens"] == 3


def test_radix_sessions_open_name_and_close_one_session_per_conversation(
    tmp_path: Path, peer: Peer
) -> None:
    trace = _trace(tmp_path / "t.jsonl", sessions=3, turns=2)
    config = OnlineConfig(peer.url, concurrency=2, radix_sessions=True)
    summary = run_online(str(trace), config)
    assert summary["errors"] == 0 and summary["requests"] == 6
    opened = [name for kind, name in peer.sessions if kind == "open"]
    assert len(set(opened)) == 3
    assert sorted(name for kind, name in peer.sessions if kind == "close") == sorted(opened)
    named = [body["session_id"] for body in peer.bodies]
    assert sorted(named) == sorted(opened * 2)  # every turn names its conversation's session
    for name in opened:  # each session's turns lie between its open and its close
        events = [(k, n) for k, n in peer.sessions if n == name]
        assert events == [("open", name), ("close", name)]
    plain = run_online(str(trace), OnlineConfig(peer.url))
    assert plain["errors"] == 0 and all("session_id" not in b for b in peer.bodies[6:])


def test_outputs_digest_tells_equal_and_different_replies(tmp_path: Path, peer: Peer) -> None:
    trace = _trace(tmp_path / "t.jsonl", sessions=1, turns=2)
    first = run_online(str(trace), OnlineConfig(peer.url))
    peer.bodies.clear()  # reply words carry the request number: same numbering, same replies
    again = run_online(str(trace), OnlineConfig(peer.url))
    assert first["outputs_sha256"] == again["outputs_sha256"]
    other = run_online(str(trace), OnlineConfig(peer.url))  # numbering continues: new replies
    assert other["outputs_sha256"] != first["outputs_sha256"]


def test_max_requests_bounds_what_is_sent(tmp_path: Path, peer: Peer) -> None:
    trace = _trace(tmp_path / "t.jsonl", sessions=3, turns=3)
    summary = run_online(str(trace), OnlineConfig(peer.url, max_requests=4, concurrency=3))
    assert summary["requests"] == 4 and len(peer.bodies) == 4


def test_max_seconds_stops_a_slow_server(tmp_path: Path, peer: Peer) -> None:
    peer.first_chunk_delay = 5.0
    trace = _trace(tmp_path / "t.jsonl", sessions=1, turns=3)
    summary = run_online(str(trace), OnlineConfig(peer.url, max_seconds=0.5))
    assert summary["wall_s"] < 3.0
    assert summary["requests"] == 1 and summary["errors"] == 1
    assert "TimeoutError" in summary["records"][0]["error"]
    (kind,) = summary["error_kinds"]  # the summary says what failed, not only how many
    assert "TimeoutError" in kind and summary["error_kinds"][kind] == 1


def test_server_error_is_recorded_and_exits_1(tmp_path: Path, peer: Peer) -> None:
    peer.status = 500
    trace = _trace(tmp_path / "t.jsonl", sessions=1, turns=2)
    parser = argparse.ArgumentParser()
    add_online_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["online", "--url", peer.url, "--trace", str(trace), "--json"])
    assert args.func(args) == 1
    assert len(peer.bodies) == 1  # a session stops at its first failed turn


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"max_requests": 0}, "max_requests"), ({"max_seconds": 0.0}, "max_seconds")],
)
def test_bad_settings_name_the_field(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        OnlineConfig("http://127.0.0.1:1", **kwargs)
    with pytest.raises(ValueError, match="url"):
        OnlineConfig("127.0.0.1:1")


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_online_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["online", *argv])
    code: int = args.func(args)
    return code


def test_cli_bad_input_and_unreachable_server_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path / "t.jsonl", sessions=1, turns=1)
    assert _cli(["--url", "http://127.0.0.1:1", "--trace", str(tmp_path / "none.jsonl")]) == 2
    assert _cli(["--url", "127.0.0.1:1", "--trace", str(trace)]) == 2
    assert _cli(["--url", "http://127.0.0.1:1", "--trace", str(trace), "--max-requests", "0"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(e.startswith("jenga-bench: error: ") for e in errors)
    assert "none.jsonl" in errors[0] and "url" in errors[1] and "max_requests" in errors[2]
    assert _cli(["--url", "http://127.0.0.1:1", "--trace", str(trace)]) == 1  # nothing listens
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "http://127.0.0.1:1" in err[0]


# ---- SGLang's agentic-trace JSON (bench/traces/agentic_trace.py) ----


@pytest.mark.sglang
def test_our_trace_written_as_agentic_trace_loads_in_sglang(tmp_path: Path) -> None:
    from sglang.benchmark.datasets.agentic_trace import AgenticTraceDataset

    from jenga_sglang.bench.traces.agentic_trace import (
        is_agentic_trace,
        read_agentic_trace,
        write_agentic_trace,
    )

    trace = _trace(tmp_path / "t.jsonl")
    config = OnlineConfig("http://x", max_output_tokens=3)
    out = tmp_path / "agentic.json"
    assert write_agentic_trace(trace, out, config) == 2
    assert is_agentic_trace(out) and not is_agentic_trace(trace)
    ours = sessions_from_trace(str(trace), config)
    # SGLang's own loader: one row per conversation, the turns' message deltas as the prompt.
    rows = AgenticTraceDataset(str(out), 0, 3, 0, None).load(tokenizer=None)
    assert [len(r.prompt) for r in rows] == [3, 3]
    for row, session in zip(rows, ours, strict=True):
        assert row.output_len == 3
        assert [turn[0]["content"] for turn in row.prompt] == [t.user_text for t in session]
        assert all(turn[0]["role"] == "user" for turn in row.prompt)
    assert rows[0].prompt_len == 5  # the trace's first input length
    # And back: the same turns as replaying the JSONL trace.
    back = read_agentic_trace(out, config)
    assert [[t.user_text for t in s] for s in back] == [[t.user_text for t in s] for s in ours]


def test_agentic_trace_replays_its_messages(tmp_path: Path, peer: Peer) -> None:
    path = tmp_path / "sglang.json"
    convo = [
        {
            "messages": [
                {"role": "system", "content": "you are a cache"},
                {"role": "user", "content": "hello there"},
            ],
            "prompt_tokens": 9,
        },
        {"messages": [], "prompt_tokens": 12},  # no new message: skipped, as SGLang does
        {"messages": [{"role": "tool", "content": "ok"}], "prompt_tokens": 14},
    ]
    path.write_text(json.dumps({"metadata": {}, "conversations": [convo]}))
    args = _online_args(["--url", peer.url, "--trace", str(path), "--json"])
    assert args.func(args) == 0
    assert [m["role"] for m in peer.bodies[0]["messages"]] == ["system", "user"]
    assert [m["role"] for m in peer.bodies[1]["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
    ]
    assert len(peer.bodies) == 2


def test_write_agentic_trace_from_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path / "t.jsonl", sessions=3, turns=2)
    out = tmp_path / "a.json"
    args = _online_args(["--trace", str(trace), "--write-agentic-trace", str(out)])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["conversations"] == 3
    assert len(json.loads(out.read_text())["conversations"]) == 3
    bad = _online_args(["--trace", str(trace)])  # replaying needs --url
    assert bad.func(bad) == 2


def _online_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_online_parser(parser.add_subparsers())
    return parser.parse_args(["online", *argv])
