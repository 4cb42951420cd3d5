"""SGLang's `agentic-trace` JSON for `jenga-bench online`: read it, and write ours in it.

SGLang 0.5.23's `bench_serving --dataset-name agentic-trace` reads one JSON object::

    {"metadata": {...},
     "conversations": [[{"messages": [{"role": ..., "content": ...}, ...],
                         "prompt_tokens": N}, ...], ...]}

one conversation a list of turns, each turn holding only the messages it adds that are not the
assistant's (the server's replies are fed back in between). `prompt_tokens` is informational.

* Reading: each conversation becomes one session, each turn one `Turn` whose messages are sent
  as they are (system, user, tool ...), the reply capped by `--max-output-tokens`.
* Writing: each session of our JSONL trace becomes one conversation, each request one turn with
  the user text `jenga-bench online` would send (bench/studies/online.py `words_for`) and the
  trace's input length as `prompt_tokens`; so `bench_serving` replays the same conversations we do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jenga_sglang.bench.traces.turns import OnlineConfig, Turn, sessions_from_trace

FORMAT = "agentic-trace"


def is_agentic_trace(path: str | Path) -> bool:
    """A `.json` file (not JSONL) whose object has `conversations`."""
    return str(path).endswith(".json") and _has_conversations(path)


def _has_conversations(path: str | Path) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "conversations" in data


def _messages(turn: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(turn, dict) or not isinstance(turn.get("messages"), list):
        raise ValueError(f"{where}: a turn must be an object with a 'messages' list")
    out = []
    for m in turn["messages"]:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"{where}: every message needs a string 'role'")
        content = m.get("content")
        out.append((m["role"], content if isinstance(content, str) else json.dumps(content)))
    return tuple(out)


def read_agentic_trace(path: str | Path, config: OnlineConfig) -> list[list[Turn]]:
    """Sessions of an agentic-trace file; turns without messages are skipped, as SGLang does."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    conversations = data.get("conversations") if isinstance(data, dict) else None
    if not isinstance(conversations, list) or not conversations:
        raise ValueError(f"{path}: no 'conversations' list")
    sessions: list[list[Turn]] = []
    for s, conversation in enumerate(conversations):
        if not isinstance(conversation, list):
            raise ValueError(f"{path}: conversation {s} is not a list of turns")
        turns = []
        for t, turn in enumerate(conversation):
            messages = _messages(turn, f"{path}: conversation {s} turn {t}")
            if messages:
                user = "\n".join(content for _, content in messages)
                turns.append(Turn(s, t, user, config.max_output_tokens, messages))
        if turns:
            sessions.append(turns)
    if not sessions:
        raise ValueError(f"{path}: no conversation has a turn with messages")
    return sessions


def write_agentic_trace(trace: str | Path, out: str | Path, config: OnlineConfig) -> int:
    """Write `trace`'s sessions (as `jenga-bench online` sends them) in SGLang's format;
    returns the number of conversations."""
    from jenga_sglang.bench.traces.trace import load_trace_with_meta

    requests, meta = load_trace_with_meta(trace)
    lengths: dict[tuple[int, int], int] = {
        (r.session_id, r.turn_id): r.num_input_tokens for r in requests
    }
    sessions = sessions_from_trace(str(trace), config)
    conversations = [
        [
            {
                "messages": [{"role": "user", "content": turn.user_text}],
                "prompt_tokens": lengths.get((turn.session_id, turn.turn_id), 0),
            }
            for turn in session
        ]
        for session in sessions
    ]
    metadata: dict[str, Any] = {"source": str(trace), "format": FORMAT, "writer": "jenga-bench"}
    if meta:
        metadata["trace_meta"] = meta
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"metadata": metadata, "conversations": conversations}, f)
    return len(conversations)
