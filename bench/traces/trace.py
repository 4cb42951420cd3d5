"""Request traces in Marconi's JSONL format: one request per line, optionally compressed.

Each line is a JSON object with the fields ``session_id, turn_id, ts, num_input_tokens,
num_output_tokens, input_tokens, output_tokens``. A trace file may start with one metadata line
``{"_meta": {...}}`` (how it was built: builder, parameters, tokenizer); the loader returns it
separately. Files ending in ``.gz`` or ``.xz`` are (de)compressed transparently.

Loading validates every line and raises :class:`TraceError` naming the file, the 1-based line
number and the offending field; nothing is returned from a file with any bad line.
"""

from __future__ import annotations

import gzip
import json
import lzma
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

META_KEY = "_meta"
FIELDS = (
    "session_id",
    "turn_id",
    "ts",
    "num_input_tokens",
    "num_output_tokens",
    "input_tokens",
    "output_tokens",
)


class TraceError(ValueError):
    """A malformed trace line: carries the file, the 1-based line number and the field."""

    def __init__(self, path: str | Path, line: int, field: str, reason: str) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.reason = reason
        super().__init__(f"{self.path}:{line}: field '{field}': {reason}")

    def __reduce__(self) -> tuple[type[TraceError], tuple[str, int, str, str]]:
        # Traces are parsed in worker processes (bench/runner.preload): the error must survive
        # pickling back to the parent with its fields.
        return TraceError, (self.path, self.line, self.field, self.reason)


@dataclass(slots=True)
class Request:
    """One request of a trace.

    ``input_tokens`` is the whole prompt (history included); ``output_tokens`` the reply the
    engine generates. ``ts`` is the arrival time in seconds from the start of the trace.
    """

    session_id: int
    turn_id: int
    ts: float
    input_tokens: list[int]
    output_tokens: list[int]

    @property
    def num_input_tokens(self) -> int:
        return len(self.input_tokens)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_tokens)

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "ts": self.ts,
            "num_input_tokens": self.num_input_tokens,
            "num_output_tokens": self.num_output_tokens,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }


def open_text(path: str | Path, mode: str) -> IO[str]:
    """Open ``path`` as text ("r" or "w"), through gzip / xz when its suffix says so.

    Writing compresses at a low level: traces are tens of millions of ids and level 1 is many
    times faster for a slightly larger file.
    """
    p = Path(path)
    if mode not in ("r", "w"):
        raise ValueError(f"mode must be 'r' or 'w', got {mode!r}")
    if p.suffix == ".gz":
        if mode == "r":
            return gzip.open(p, "rt", encoding="utf-8")
        return gzip.open(p, "wt", encoding="utf-8", compresslevel=1)
    if p.suffix == ".xz":
        if mode == "r":
            return lzma.open(p, "rt", encoding="utf-8")
        return lzma.open(p, "wt", encoding="utf-8", preset=1)
    return open(p, mode, encoding="utf-8")


def sort_requests(requests: Iterable[Request]) -> list[Request]:
    """Arrival order: by ts, ties broken by session then turn (so turns stay in order)."""
    return sorted(requests, key=lambda r: (r.ts, r.session_id, r.turn_id))


def write_trace(
    path: str | Path, requests: Iterable[Request], meta: dict[str, Any] | None = None
) -> int:
    """Write ``requests`` (which must already be in ts order) to ``path``; returns the count.

    The file is written to a temporary sibling and renamed, so a reader never sees half a trace;
    a write that fails leaves neither. A directory is refused (ValueError) before anything is
    written.
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{p} is a directory: give a trace file (.jsonl, .jsonl.gz, .jsonl.xz)")
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp" + p.suffix)
    n = 0
    try:
        with open_text(tmp, "w") as f:
            if meta is not None:
                f.write(json.dumps({META_KEY: meta}, separators=(",", ":")) + "\n")
            for r in requests:
                f.write(json.dumps(r.to_json(), separators=(",", ":")) + "\n")
                n += 1
        tmp.replace(p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n


def load_trace(path: str | Path) -> list[Request]:
    """Load and validate a trace; raises :class:`TraceError` on the first bad line."""
    return load_trace_with_meta(path)[0]


def load_trace_with_meta(path: str | Path) -> tuple[list[Request], dict[str, Any]]:
    """Like :func:`load_trace`, also returning the metadata header (``{}`` when absent)."""
    checker = _Checker(path)
    meta: dict[str, Any] = {}
    out: list[Request] = []
    with open_text(path, "r") as f:
        for lineno, text in enumerate(_lines(f), start=1):
            if not text.strip():
                raise TraceError(path, lineno, "<line>", "empty line")
            obj = _parse(path, lineno, text)
            if lineno == 1 and META_KEY in obj:
                meta = _meta(path, obj)
                continue
            out.append(checker.request(lineno, obj))
    return out, meta


def _lines(f: IO[str]) -> Iterator[str]:
    for line in f:
        yield line.rstrip("\n")


def _parse(path: str | Path, lineno: int, text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        msg = f"invalid JSON: {e.msg} at column {e.colno}"
        raise TraceError(path, lineno, "<json>", msg) from None
    if not isinstance(obj, dict):
        raise TraceError(path, lineno, "<json>", f"expected an object, got {type(obj).__name__}")
    return obj


def _meta(path: str | Path, obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj[META_KEY]
    if not isinstance(meta, dict):
        raise TraceError(path, 1, META_KEY, "metadata must be an object")
    return meta


def _is_int(v: object) -> bool:
    return type(v) is int  # bool is a subclass of int: reject it


def _token_list_error(v: object) -> str | None:
    if not isinstance(v, list):
        return f"expected a list of token ids, got {type(v).__name__}"
    # Checked in bulk (C loops) because traces hold tens of millions of ids.
    if v and not set(map(type, v)) <= {int}:
        return "token ids must be integers"
    if v and min(v) < 0:
        return "token ids must be >= 0"
    return None


class _Checker:
    """Validates one request line at a time, with the cross-line rules (ts order, turn order)."""

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self.last_ts = -math.inf
        self.last_turn: dict[int, int] = {}

    def fail(self, lineno: int, field: str, reason: str) -> TraceError:
        return TraceError(self.path, lineno, field, reason)

    def request(self, lineno: int, obj: dict[str, Any]) -> Request:
        for name in FIELDS:
            if name not in obj:
                raise self.fail(lineno, name, "missing")
        extra = sorted(set(obj) - set(FIELDS))
        if extra:
            raise self.fail(lineno, extra[0], "unknown field")
        sid, turn, ts = self._ids(lineno, obj)
        inp = self._tokens(lineno, obj, "input_tokens", "num_input_tokens")
        if not inp:
            raise self.fail(lineno, "input_tokens", "a request needs at least one input token")
        outp = self._tokens(lineno, obj, "output_tokens", "num_output_tokens")
        self._order(lineno, sid, turn, ts)
        return Request(sid, turn, ts, inp, outp)

    def _ids(self, lineno: int, obj: dict[str, Any]) -> tuple[int, int, float]:
        sid, turn, ts = obj["session_id"], obj["turn_id"], obj["ts"]
        if not _is_int(sid) or sid < 0:
            raise self.fail(lineno, "session_id", f"expected an integer >= 0, got {sid!r}")
        if not _is_int(turn) or turn < 0:
            raise self.fail(lineno, "turn_id", f"expected an integer >= 0, got {turn!r}")
        if not (_is_int(ts) or type(ts) is float) or not math.isfinite(ts):
            raise self.fail(lineno, "ts", f"expected a finite number, got {ts!r}")
        if ts < 0:
            raise self.fail(lineno, "ts", f"must be >= 0, got {ts!r}")
        return sid, turn, float(ts)

    def _tokens(self, lineno: int, obj: dict[str, Any], field: str, count: str) -> list[int]:
        toks, n = obj[field], obj[count]
        err = _token_list_error(toks)
        if err is not None:
            raise self.fail(lineno, field, err)
        if not _is_int(n) or n < 0:
            raise self.fail(lineno, count, f"expected an integer >= 0, got {n!r}")
        if n != len(toks):
            raise self.fail(lineno, count, f"says {n} but {field} has {len(toks)} entries")
        return cast(list[int], toks)

    def _order(self, lineno: int, sid: int, turn: int, ts: float) -> None:
        if ts < self.last_ts:
            msg = f"{ts} is earlier than the previous line's {self.last_ts} (must be sorted)"
            raise self.fail(lineno, "ts", msg)
        prev = self.last_turn.get(sid)
        if prev is not None and turn <= prev:
            raise self.fail(
                lineno, "turn_id", f"session {sid}: turn {turn} after turn {prev} (must increase)"
            )
        self.last_ts = ts
        self.last_turn[sid] = turn
