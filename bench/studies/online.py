"""`jenga-bench online`: replay a trace's sessions against an OpenAI-compatible chat server.

    jenga-bench online --url http://127.0.0.1:30000 --trace T.jsonl.gz --max-requests 20 --json

Each session of the trace becomes one conversation: its turns are sent in order, each with the
whole history (earlier user messages and the server's own replies), so the server sees the same
growing prefix a chat application sends. Requests stream (TTFT = time to the first content
chunk), decode greedily (temperature 0) and ask for the usage report, whose
``prompt_tokens_details.cached_tokens`` is the prefix the server's cache served.

The user message of a turn is made from the trace ids it adds (bench/traces/turns.py);
replies are the server's, capped by the trace's output length. With ``--radix-sessions`` each
conversation is an SGLang session: opened before its first turn, named in every request,
closed after its last (SGLang's ``--enable-session-radix-cache`` keeps its history for it).

Bounds: ``--max-requests`` requests in all, nothing new sent after ``--max-seconds``, and no
request outlives that deadline. Sessions run ``--concurrency`` at a time, each turn after the
previous one's reply (closed loop; arrival times are not replayed).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from jenga_sglang.bench.traces.turns import OnlineConfig, Turn, sessions_from_trace


class OnlineError(RuntimeError):
    """A malformed server reply (bad JSON, missing fields, error status)."""


@dataclass(slots=True)
class TurnResult:
    """What one request measured; ``error`` is set (and the counts are 0) when it failed."""

    session_id: int
    turn_index: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    latency_s: float = 0.0
    text: str = ""
    error: str | None = None
    response_id: str = ""  # the stream's `id`: a router's logs name the request by it


def _usage(chunk: dict[str, Any]) -> tuple[int, int, int] | None:
    usage = chunk.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
    return int(usage["prompt_tokens"]), int(cached or 0), int(usage["completion_tokens"])


def _delta_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    delta = choices[0].get("delta") or {}
    return str(delta.get("content") or "")


@dataclass
class _Run:
    """Shared state of one replay: the request budget and the deadline."""

    config: OnlineConfig
    model: str
    deadline: float
    sent: int = 0
    results: list[TurnResult] = field(default_factory=list)

    def has_budget(self) -> bool:
        return self.sent < self.config.max_requests and time.monotonic() < self.deadline

    def take(self) -> bool:
        """Claim one request of the budget; False once the budget or the time is spent."""
        if not self.has_budget():
            return False
        self.sent += 1
        return True


async def _stream_chat(
    session: Any,
    run: _Run,
    messages: list[dict[str, str]],
    result: TurnResult,
    max_tokens: int,
    session_id: str | None = None,
) -> None:
    """Send one streaming chat request and fill ``result`` from its chunks."""
    import aiohttp

    body: dict[str, Any] = {
        "model": run.model,
        "messages": messages,
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if session_id is not None:
        body["session_id"] = session_id
    start = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=max(0.001, run.deadline - start))
    url = run.config.url.rstrip("/") + "/v1/chat/completions"
    parts: list[str] = []
    async with session.post(url, json=body, timeout=timeout) as resp:
        if resp.status != 200:
            raise OnlineError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        async for raw in resp.content:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                break
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError as exc:
                raise OnlineError(f"bad stream chunk {data[:80]!r}: {exc.msg}") from None
            if "error" in chunk:
                raise OnlineError(f"server error: {chunk['error']}")
            result.response_id = result.response_id or str(chunk.get("id") or "")
            piece = _delta_text(chunk)
            if piece and result.ttft_s is None:
                result.ttft_s = time.monotonic() - start
            parts.append(piece)
            usage = _usage(chunk)
            if usage is not None:
                result.prompt_tokens, result.cached_tokens, result.completion_tokens = usage
    result.latency_s = time.monotonic() - start
    result.text = "".join(parts)
    if result.prompt_tokens == 0:
        raise OnlineError("the stream ended without a usage report")


async def _session_call(session: Any, run: _Run, path: str, body: dict[str, Any]) -> None:
    """POST /open_session or /close_session; OnlineError unless the server says 200."""
    import aiohttp

    url = run.config.url.rstrip("/") + path
    timeout = aiohttp.ClientTimeout(total=max(1.0, run.deadline - time.monotonic()))
    async with session.post(url, json=body, timeout=timeout) as resp:
        if resp.status != 200:
            raise OnlineError(f"{path}: HTTP {resp.status}: {(await resp.text())[:200]}")


async def _run_session(session: Any, run: _Run, turns: list[Turn]) -> None:
    """One conversation, as an SGLang session with ``radix_sessions`` (closed however it
    ends); a failed open is recorded as its first turn's error."""
    if not run.config.radix_sessions or not turns or not run.has_budget():
        await _run_turns(session, run, turns, None)
        return
    name = f"jenga-bench-{turns[0].session_id}-{id(turns):x}"
    try:
        await _session_call(session, run, "/open_session", {"capacity_of_str_len": 1 << 30,
                                                            "session_id": name})  # fmt: skip
    except (TimeoutError, OnlineError, OSError) as exc:
        if run.take():
            failed = TurnResult(turns[0].session_id, 0, error=f"{type(exc).__name__}: {exc}")
            run.results.append(failed)
        return
    sent = len(run.results)
    await _run_turns(session, run, turns, name)
    try:
        await _session_call(session, run, "/close_session", {"session_id": name})
    except (TimeoutError, OnlineError, OSError) as exc:
        mine = [r for r in run.results[sent:] if r.session_id == turns[0].session_id]
        if mine and mine[-1].error is None:  # a session left open is the last turn's failure
            mine[-1].error = f"close: {type(exc).__name__}: {exc}"


async def _run_turns(session: Any, run: _Run, turns: list[Turn], name: str | None) -> None:
    """Send one session's turns in order, keeping the history; stop at the first failure."""
    messages: list[dict[str, str]] = []
    for index, turn in enumerate(turns):
        if not run.take():
            return
        if turn.messages:
            messages.extend({"role": role, "content": text} for role, text in turn.messages)
        else:
            messages.append({"role": "user", "content": turn.user_text})
        result = TurnResult(turn.session_id, index)
        run.results.append(result)
        try:
            await _stream_chat(session, run, messages, result, turn.max_tokens, name)
        except (TimeoutError, OnlineError, OSError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            return
        messages.append({"role": "assistant", "content": result.text})


async def _first_model(session: Any, url: str) -> str:
    async with session.get(url.rstrip("/") + "/v1/models") as resp:
        if resp.status != 200:
            raise OnlineError(f"GET /v1/models: HTTP {resp.status}")
        data = await resp.json()
    models = data.get("data") or []
    if not models:
        raise OnlineError("GET /v1/models listed no model")
    return str(models[0]["id"])


async def replay(sessions: list[list[Turn]], config: OnlineConfig) -> list[TurnResult]:
    """Replay ``sessions`` against the server; returns one result per request sent."""
    import aiohttp

    deadline = time.monotonic() + config.max_seconds
    async with aiohttp.ClientSession() as session:
        model = config.model or await _first_model(session, config.url)
        run = _Run(config, model, deadline)
        queue = list(reversed(sessions))

        async def worker() -> None:
            while queue and run.has_budget():
                await _run_session(session, run, queue.pop())

        await asyncio.gather(*(worker() for _ in range(config.concurrency)))
    return run.results


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(results: list[TurnResult], wall_s: float) -> dict[str, Any]:
    """One JSON-able summary: totals, cached tokens and TTFT by turn index, and every request.

    ``error_kinds`` counts the five most frequent error texts, so a summary that reports
    failures also says what they were.

    ``outputs_sha256`` hashes the replies in (session, turn) order, so two runs of the same
    trace with greedy decoding can be compared for identical outputs with one field.
    """
    ok = [r for r in results if r.error is None]
    by_turn: dict[int, list[TurnResult]] = {}
    for r in ok:
        by_turn.setdefault(r.turn_index, []).append(r)
    per_turn = [
        {
            "turn": t,
            "requests": len(rs),
            "prompt_tokens": sum(r.prompt_tokens for r in rs),
            "cached_tokens": sum(r.cached_tokens for r in rs),
            "mean_ttft_s": _mean([r.ttft_s for r in rs if r.ttft_s is not None]),
        }
        for t, rs in sorted(by_turn.items())
    ]
    ordered = sorted(ok, key=lambda r: (r.session_id, r.turn_index))
    digest = hashlib.sha256("\x00".join(r.text for r in ordered).encode("utf-8")).hexdigest()
    ttfts = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    return {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "error_kinds": dict(Counter(r.error for r in results if r.error).most_common(5)),
        "sessions": len({r.session_id for r in results}),
        "wall_s": round(wall_s, 3),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_ratio": cached / prompt if prompt else 0.0,
        "mean_ttft_s": _mean(ttfts),
        "p50_ttft_s": ttfts[len(ttfts) // 2] if ttfts else None,
        "per_turn": per_turn,
        "outputs_sha256": digest,
        "records": [asdict(r) for r in ordered] + [asdict(r) for r in results if r.error],
    }


def run_online(trace: str, config: OnlineConfig) -> dict[str, Any]:
    """Load ``trace``, replay it against ``config.url`` and return the summary."""
    sessions = sessions_from_trace(trace, config)
    start = time.monotonic()
    results = asyncio.run(replay(sessions, config))
    return summarize(results, time.monotonic() - start)
