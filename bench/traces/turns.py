"""A trace's sessions as chat turns for `jenga-bench online`: the text each turn adds.

Trace token ids are not text, and they belong to whatever tokenizer built the trace, not the
served model's. The user message of a turn is therefore made from the ids the turn adds to the
conversation: one word of a fixed list per id (``id % len(WORDS)``). Equal ids give equal words,
so prefixes shared in the trace stay shared in text, turn lengths follow the trace in words, and
no tokenizer is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WORDS = [
    "cache",
    "state",
    "token",
    "prefix",
    "model",
    "layer",
    "memory",
    "page",
    "slot",
    "turn",
    "user",
    "reply",
    "server",
    "query",
    "answer",
    "fast",
    "small",
    "large",
    "first",
    "last",
    "next",
    "shared",
    "branch",
    "checkpoint",
    "attention",
    "mamba",
    "scan",
    "chunk",
    "block",
    "tree",
    "node",
    "leaf",
    "root",
    "path",
    "hit",
    "miss",
    "evict",
    "keep",
    "store",
    "load",
    "copy",
    "move",
    "read",
    "write",
    "time",
    "cost",
]


@dataclass(frozen=True, slots=True)
class Turn:
    """One request to send: the new user text and the reply length to ask for.

    ``messages`` (role, content) pairs, when given, are sent instead of one user message
    (an agentic-trace turn: bench/traces/agentic_trace.py)."""

    session_id: int
    turn_id: int
    user_text: str
    max_tokens: int
    messages: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class OnlineConfig:
    """Client settings; ``model`` None asks the server's /v1/models for the first model.
    ``radix_sessions``: each conversation opens an SGLang session (/open_session), names it in
    every request (``session_id``) and closes it after its last turn, as a client of SGLang's
    ``--enable-session-radix-cache`` does (a server without the flag serves them as usual)."""

    url: str
    max_requests: int = 50
    max_seconds: float = 120.0
    concurrency: int = 4
    max_user_words: int = 128
    max_output_tokens: int = 32
    model: str | None = None
    radix_sessions: bool = False

    def __post_init__(self) -> None:
        for name in ("max_requests", "concurrency", "max_user_words", "max_output_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be > 0, got {self.max_seconds}")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")


def words_for(ids: Sequence[int], limit: int) -> str:
    """Text for trace ids: one word per id, at most ``limit`` words (never empty)."""
    text = " ".join(WORDS[i % len(WORDS)] for i in ids[:limit])
    return text or WORDS[0]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def sessions_from_trace(path: str, config: OnlineConfig) -> list[list[Turn]]:
    """Sessions (in order of first arrival) as turns with the user text each turn adds.

    A turn's new ids are its input past the previous turn's input + output when that is a prefix
    of it, otherwise past the longest common prefix with it (agent traces may rewrite history).
    """
    from jenga_sglang.bench.traces.trace import load_trace

    sessions: dict[int, list[Turn]] = {}
    seen: dict[int, list[int]] = {}
    for r in load_trace(path):
        before = seen.get(r.session_id, [])
        new = r.input_tokens[_common_prefix(before, r.input_tokens) :]
        turns = sessions.setdefault(r.session_id, [])
        max_tokens = max(1, min(r.num_output_tokens, config.max_output_tokens))
        user = words_for(new, config.max_user_words)
        turns.append(Turn(r.session_id, r.turn_id, user, max_tokens))
        seen[r.session_id] = r.input_tokens + r.output_tokens
    return list(sessions.values())
