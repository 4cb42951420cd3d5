"""Packed traces cached next to their files, so a repeated sweep skips parsing them.

Parsing and validating a ShareGPT trace costs about 3 s of CPU (JSON, then the token checks),
which a sweep pays before its first run. The first load of a trace writes its packed requests
here; later loads read them back in a fraction of that:

    data/traces/x.jsonl.gz  ->  data/traces/.packed/x.jsonl.gz.<blake2b of its bytes>.v1

The key is a digest of the file's bytes (~20 ms for an 11 MB trace; modification times are too
coarse to tell two quick rewrites apart), so an edited or rebuilt trace is parsed and validated
again; older entries of the same trace are removed when a new one is written.
The file holds plain values only (ints, floats, bytes), read by an unpickler that refuses
every global, so a planted file cannot run code, and the pure and the compiled modules read
the same files. A directory we cannot write, or a cache file we cannot read, only means
parsing as before. `JENGA_TRACE_CACHE=0` turns the cache off.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from pathlib import Path
from typing import Any

from jenga_sglang.bench.traces.packed import PackedRequest
from jenga_sglang.radix.tokens import TokenSeq

VERSION = "v1"
_Row = tuple[int, int, float, bytes, bytes]


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"trace cache holds plain values only, not {module}.{name}")


def enabled() -> bool:
    return os.environ.get("JENGA_TRACE_CACHE", "1") != "0"


def cache_path(trace: Path) -> Path:
    digest = hashlib.blake2b(trace.read_bytes(), digest_size=16).hexdigest()
    return trace.parent / ".packed" / f"{trace.name}.{digest}.{VERSION}"


def load(trace: Path) -> list[PackedRequest] | None:
    """The cached packed requests of `trace`, or None (no entry, stale, unreadable, off)."""
    if not enabled():
        return None
    try:
        data = cache_path(trace).read_bytes()
        rows: list[_Row] = _PlainUnpickler(io.BytesIO(data)).load()
        return [
            PackedRequest(session, turn, ts, TokenSeq(inp), TokenSeq(out))
            for session, turn, ts, inp, out in rows
        ]
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError):
        return None


def store(trace: Path, packed: list[PackedRequest]) -> None:
    """Write the entry for `trace` (best effort: a read-only directory is fine)."""
    if not enabled():
        return
    rows = [(r.session_id, r.turn_id, r.ts, r.inp.packed, r.out.packed) for r in packed]
    target = cache_path(trace)
    try:
        target.parent.mkdir(exist_ok=True)
        for old in target.parent.glob(f"{trace.name}.*"):
            old.unlink(missing_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        partial.write_bytes(pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL))
        partial.replace(target)  # atomic: concurrent sweeps never read half a file
    except OSError:
        return
