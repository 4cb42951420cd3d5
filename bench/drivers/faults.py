"""Load and fault probes against a live SGLang server (tests/test_serve_faults.py,
bench/studies/soak.py).

Plain blocking HTTP on loopback, one connection per request, every call bounded by a timeout:
`generate` answers (status, body) instead of raising on 4xx, `stream_generate` reads a /generate
stream to its end or cancels it (closes the connection) after `cancel_after` chunks, which is
how a client going away looks to SGLang.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass(frozen=True)
class StreamResult:
    status: int
    chunks: int  # data events read
    text: str  # the last text seen
    cached_tokens: int
    ttft_s: float | None  # seconds to the first data event
    cancelled: bool


def _connection(url: str, timeout_s: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout_s)


def _body(
    input_ids: list[int] | None,
    max_new_tokens: int,
    stream: bool,
    text: str | None = None,
    logprobs: bool = False,
    top_logprobs: int = 0,
    logprob_start_len: int | None = None,
) -> bytes:
    body: dict[str, Any] = {
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
        "stream": stream,
    }
    if logprobs:
        body["return_logprob"] = True
    if logprobs and top_logprobs and input_ids is not None:
        # the reply's tokens only (from the prompt's last position)
        body.update(top_logprobs_num=top_logprobs, logprob_start_len=len(input_ids) - 1)
    if logprobs and logprob_start_len is not None:  # the prompt's tokens too, from there
        body["logprob_start_len"] = logprob_start_len
    if text is not None:
        body["text"] = text
    else:
        body["input_ids"] = input_ids
    return json.dumps(body).encode()


def generate(
    url: str,
    input_ids: list[int] | None,
    max_new_tokens: int = 4,
    *,
    text: str | None = None,
    timeout_s: float = 240.0,
    logprobs: bool = False,
    top_logprobs: int = 0,
    logprob_start_len: int | None = None,
) -> tuple[int, dict[str, Any]]:
    """POST /generate; (HTTP status, decoded JSON body), 4xx included. `logprobs`: the reply
    tokens' log-probabilities in `meta_info.output_token_logprobs`, and with `top_logprobs`
    k > 0 (token ids only) each reply token's k most likely in `output_top_logprobs`; with
    `logprob_start_len` s, also each prompt token's from position s on, in
    `meta_info.input_token_logprobs`."""
    body = _body(input_ids, max_new_tokens, False, text, logprobs, top_logprobs, logprob_start_len)
    return post_generate(url, body, timeout_s)


def generate_body(url: str, payload: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
    """POST `payload` (any fields of SGLang's GenerateReqInput) to /generate; the decoded
    reply, or RuntimeError naming the status."""
    status, body = post_generate(url, json.dumps(payload).encode(), timeout_s)
    if status != 200:
        raise RuntimeError(f"{url}/generate: HTTP {status}: {str(body)[:500]}")
    return body


def post_generate(url: str, body: bytes, timeout_s: float) -> tuple[int, dict[str, Any]]:
    """POST a JSON `body` to /generate; (HTTP status, decoded JSON reply)."""
    conn = _connection(url, timeout_s)
    try:
        headers = {"Content-Type": "application/json"}
        conn.request("POST", "/generate", body, headers)
        reply = conn.getresponse()
        raw = reply.read()
        try:
            decoded = json.loads(raw)
        except ValueError:
            decoded = {"raw": raw.decode(errors="replace")}
        return reply.status, decoded if isinstance(decoded, dict) else {"value": decoded}
    finally:
        conn.close()


def stream_generate(
    url: str,
    input_ids: list[int],
    max_new_tokens: int,
    *,
    cancel_after: int | None = None,
    timeout_s: float = 240.0,
) -> StreamResult:
    """Stream /generate; close the connection after `cancel_after` data events if given."""
    start = time.monotonic()
    conn = _connection(url, timeout_s)
    chunks, text, cached, ttft = 0, "", 0, None
    try:
        headers = {"Content-Type": "application/json"}
        conn.request("POST", "/generate", _body(input_ids, max_new_tokens, True), headers)
        reply = conn.getresponse()
        if reply.status != 200:
            reply.read()
            return StreamResult(reply.status, 0, "", 0, None, False)
        while True:
            line = reply.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[len(b"data:") :].strip()
            if payload == b"[DONE]":
                break
            if ttft is None:
                ttft = time.monotonic() - start
            chunks += 1
            event = json.loads(payload)
            text = str(event.get("text", text))
            cached = int(event.get("meta_info", {}).get("cached_tokens", cached))
            if cancel_after is not None and chunks >= cancel_after:
                return StreamResult(200, chunks, text, cached, ttft, True)
        return StreamResult(200, chunks, text, cached, ttft, False)
    finally:
        conn.close()


def flush_cache(url: str, timeout_s: float = 120.0, tries: int = 20) -> None:
    """POST /flush_cache. SGLang flushes only when idle and answers 400 otherwise; a request
    whose reply has come back may still be in its running batch for a step, so a 400 is
    retried, `tries` times at most, 0.25 s apart. Its reply is plain text."""
    for attempt in range(tries):
        conn = _connection(url, timeout_s)
        try:
            conn.request("POST", "/flush_cache")
            reply = conn.getresponse()
            body = reply.read()
        finally:
            conn.close()
        if reply.status == 200:
            return
        if reply.status != 400 or attempt == tries - 1:
            raise RuntimeError(f"/flush_cache: HTTP {reply.status}: {body[:200]!r}")
        time.sleep(0.25)


def abort_request(url: str, rid: str, timeout_s: float = 30.0) -> int:
    """POST /abort_request for one request id (SGLang's, as a router sends when its client
    goes); the HTTP status. An id the server no longer knows is not an error there."""
    conn = _connection(url, timeout_s)
    try:
        headers = {"Content-Type": "application/json"}
        conn.request("POST", "/abort_request", json.dumps({"rid": rid}).encode(), headers)
        reply = conn.getresponse()
        reply.read()
        return reply.status
    finally:
        conn.close()


def health(url: str, timeout_s: float = 30.0) -> bool:
    conn = _connection(url, timeout_s)
    try:
        conn.request("GET", "/health")
        reply = conn.getresponse()
        reply.read()
        return reply.status == 200
    except OSError:
        return False
    finally:
        conn.close()


_KNOWN = "post-warmup freeze_gc failed"


def unexpected_tracebacks(log_text: str) -> int:
    """Tracebacks in a server log, not counting SGLang's known start-up one.

    With `--skip-server-warmup`, SGLang 0.5.23's post-warmup `freeze_gc` call can reach its own
    port before uvicorn listens; it logs `post-warmup freeze_gc failed` and a chained traceback
    (several "Traceback" lines) and serves on. That block ends at the next timestamped line.
    """
    count, skipping = 0, False
    for line in log_text.splitlines():
        if _KNOWN in line:
            skipping = True
            continue
        if skipping and line.startswith("["):
            skipping = False
        if not skipping and line.startswith("Traceback"):
            count += 1
    return count
