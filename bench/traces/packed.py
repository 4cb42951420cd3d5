"""A trace's requests packed once for replay: token lists as `TokenSeq`, shared by every run
of a sweep (and cached next to the trace file, trace_cache.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mypy_extensions import mypyc_attr

from jenga_sglang.bench.traces.trace import Request
from jenga_sglang.radix.tokens import TokenSeq


# Sent between processes: mypyc-compiled frozen dataclasses cannot be unpickled, so this one
# stays a Python class in the optional build (scripts/build_compiled.py).
@mypyc_attr(native_class=False)
@dataclass(frozen=True, slots=True)
class PackedRequest:
    """A trace request with its tokens packed once (TokenSeq), shared by every run."""

    session_id: int
    turn_id: int
    ts: float
    inp: TokenSeq
    out: TokenSeq


def pack(requests: Iterable[Request]) -> list[PackedRequest]:
    """Pack a loaded trace; do this once per trace, not once per run."""
    return [
        PackedRequest(
            r.session_id, r.turn_id, r.ts, TokenSeq.of(r.input_tokens), TokenSeq.of(r.output_tokens)
        )
        for r in requests
    ]
