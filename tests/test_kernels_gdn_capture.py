"""Exactness of the Gated DeltaNet capture (kernels/gdn_capture.py) on SGLang's own chunked
forward (its vendored FLA kernels, float32, Triton interpreter on CPU).

A packed prefill of rows across 64-token chunk boundaries (some resumed from pool states) runs
through SGLang's `chunk_gated_delta_rule`; the chunk states `h` and the delta values `v_new`
it computed are read off its `chunk_gated_delta_rule_fwd_h`, and the state at positions inside,
at and around chunk boundaries is captured from them and compared with a float64 recurrence and
with SGLang's own kernel run over the prefix alone.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import triton_cpu  # noqa: F401  (interpreter patches before the kernels import triton)

from jenga_sglang import cpu_gdn
from jenga_sglang.kernels.gdn_capture import GDN_CHUNK, GdnCaptures, capture_gdn_states

pytestmark = [pytest.mark.exactness, pytest.mark.sglang]

HK, HV, K, V = 2, 4, 16, 16
ROWS = (130, 1, 70)
RESUMED = (False, False, True)  # row 2 starts from a cached state
FP32_TOL = 2e-5


@dataclass(frozen=True)
class Inputs:
    q: torch.Tensor  # (1, T, HK, K)
    k: torch.Tensor
    v: torch.Tensor  # (1, T, HV, V)
    g: torch.Tensor  # (1, T, HV) log decay
    beta: torch.Tensor  # (1, T, HV)
    start: torch.Tensor  # (rows, HV, V, K)

    def rows(self, lo: int, hi: int, start: torch.Tensor) -> Inputs:
        cut = (getattr(self, f)[:, lo:hi] for f in ("q", "k", "v", "g", "beta"))
        return Inputs(*cut, start)


@functools.cache
def make_inputs() -> Inputs:
    gen = torch.Generator().manual_seed(0)
    t = sum(ROWS)
    start = torch.randn(len(ROWS), HV, V, K, generator=gen) * 0.5
    start[[i for i, r in enumerate(RESUMED) if not r]] = 0.0
    return Inputs(
        q=torch.randn(1, t, HK, K, generator=gen),
        k=torch.randn(1, t, HK, K, generator=gen),
        v=torch.randn(1, t, HV, V, generator=gen),
        g=torch.nn.functional.logsigmoid(torch.randn(1, t, HV, generator=gen)),
        beta=torch.rand(1, t, HV, generator=gen),
        start=start,
    )


def cu_of(lengths: tuple[int, ...] | list[int]) -> list[int]:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


@contextmanager
def recording() -> Iterator[dict[str, Any]]:
    """Record the arguments and results of SGLang's `chunk_gated_delta_rule_fwd_h`."""
    chunk = importlib.import_module("sglang.kernels.ops.attention.fla.chunk")
    original = chunk.chunk_gated_delta_rule_fwd_h
    seen: dict[str, Any] = {}

    def wrapped(**kw: Any) -> Any:
        h, v_new = original(**kw)
        seen.update(kw, h=h, v_new=v_new)
        return h, v_new

    chunk.chunk_gated_delta_rule_fwd_h = wrapped
    try:
        yield seen
    finally:
        chunk.chunk_gated_delta_rule_fwd_h = original


def sglang_forward(inputs: Inputs, lengths: list[int]) -> tuple[torch.Tensor, dict[str, Any]]:
    """SGLang's GDN extend kernel over packed rows from pool slots 1..rows; returns the pool
    (final states) and what its chunk-state function saw."""
    cpu_gdn.install()
    gdn = importlib.import_module("sglang.srt.layers.attention.linear.kernels.gdn_triton")
    pool = torch.zeros(len(lengths) + 1, HV, V, K)
    pool[1:] = inputs.start
    with recording() as seen:
        gdn.chunk_gated_delta_rule(
            q=inputs.q, k=inputs.k, v=inputs.v, g=inputs.g, beta=inputs.beta,
            initial_state=pool, initial_state_indices=torch.arange(1, len(lengths) + 1),
            cu_seqlens=torch.tensor(cu_of(lengths), dtype=torch.int32), head_first=False,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
    return pool, seen


def recurrence(inputs: Inputs, row: int) -> torch.Tensor:
    """Float64 states after every prefix of row `row`: (len + 1, HV, V, K)."""
    lo, hi = cu_of(ROWS)[row], cu_of(ROWS)[row + 1]
    rep = HV // HK
    k = inputs.k[0, lo:hi].double()
    k = (k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(rep, 1)
    v, g, beta = (t[0, lo:hi].double() for t in (inputs.v, inputs.g, inputs.beta))
    s = inputs.start[row].double()
    out = [s]
    for t in range(hi - lo):
        s = s * torch.exp(g[t])[:, None, None]
        delta = beta[t][:, None] * (v[t] - torch.einsum("hvk,hk->hv", s, k[t]))
        s = s + torch.einsum("hv,hk->hvk", delta, k[t])
        out.append(s)
    return torch.stack(out)


POSITIONS = {0: (1, 2, 63, 64, 65, 100, 127, 128, 129, 130), 1: (1,), 2: (3, 64, 69, 70)}


def plan(positions: dict[int, tuple[int, ...]]) -> tuple[list[tuple[int, int]], GdnCaptures]:
    """(row, offset) per capture and the launch's indices: the chunk of `h` holding the state
    entering chunk min(o // 64, last chunk) of the row, and the row's tokens after it."""
    cu = cu_of(ROWS)
    chunks = [-(-n // GDN_CHUNK) for n in ROWS]
    first = cu_of(chunks)
    caps, src, start, count = [], [], [], []
    for row, offsets in positions.items():
        for o in offsets:
            i_t = min(o // GDN_CHUNK, chunks[row] - 1)
            caps.append((row, o))
            src.append(first[row] + i_t)
            start.append(cu[row] + i_t * GDN_CHUNK)
            count.append(o - i_t * GDN_CHUNK)
    n = len(caps)
    return caps, GdnCaptures(*(torch.tensor(v) for v in (src, list(range(n)), start, count)))


@functools.cache
def captured() -> tuple[list[tuple[int, int]], torch.Tensor]:
    inputs = make_inputs()
    _, seen = sglang_forward(inputs, list(ROWS))
    caps, idx = plan(POSITIONS)
    # A strided pool, NaN-filled: the Jenga pool's slot stride exceeds one state.
    out = torch.full((len(caps), HV * V * K + 24), float("nan"))[:, 24:].view(-1, HV, V, K)
    capture_gdn_states(seen["h"][0], out, seen["k"][0], seen["v_new"][0], seen["g"][0], idx)
    return caps, out


def test_captures_match_the_float64_recurrence() -> None:
    inputs = make_inputs()
    caps, out = captured()
    for i, (row, o) in enumerate(caps):
        err = float((out[i].double() - recurrence(inputs, row)[o]).abs().max())
        assert err <= FP32_TOL, (row, o, err)


def test_captures_equal_sglangs_forward_of_the_prefix_alone() -> None:
    inputs = make_inputs()
    caps, out = captured()
    cu = cu_of(ROWS)
    parts = [inputs.rows(cu[r], cu[r] + o, inputs.start[r : r + 1]) for r, o in caps]
    packed = Inputs(
        *(torch.cat([getattr(p, f) for p in parts], dim=1) for f in ("q", "k", "v", "g", "beta")),
        torch.cat([p.start for p in parts]),
    )
    pool, _ = sglang_forward(packed, [o for _, o in caps])
    for i, cap in enumerate(caps):
        assert (out[i] - pool[i + 1]).abs().max() <= FP32_TOL, cap


def test_bad_arguments_raise_before_launching() -> None:
    inputs = make_inputs()
    _, seen = sglang_forward(inputs, list(ROWS))
    h, k, v_new, g = seen["h"][0], seen["k"][0], seen["v_new"][0], seen["g"][0]
    out = torch.zeros(2, HV, V, K)

    def caps(**over: list[int]) -> GdnCaptures:
        v = {"src": [1], "dst": [0], "start": [64], "count": [3]}
        v.update(over)
        return GdnCaptures(*(torch.tensor(v[f]) for f in ("src", "dst", "start", "count")))

    capture_gdn_states(h, out, k, v_new, g, caps())
    with pytest.raises(ValueError, match="more than a chunk"):
        capture_gdn_states(h, out, k, v_new, g, caps(count=[65]))
    with pytest.raises(ValueError, match=r"src\[0\] = 99 is out of range"):
        capture_gdn_states(h, out, k, v_new, g, caps(src=[99]))
    with pytest.raises(ValueError, match="both name slot"):
        capture_gdn_states(h, out, k, v_new, g, caps(src=[1, 2], dst=[1, 1], start=[0, 1],
                                                      count=[1, 1]))  # fmt: skip
    with pytest.raises(ValueError, match="g: expected shape"):
        capture_gdn_states(h, out, k, v_new, g[:, :1], caps())
    with pytest.raises(ValueError, match="out shares storage with h"):
        capture_gdn_states(h, h, k, v_new, g, caps(dst=[0]))
    with pytest.raises(ValueError, match=r"out: each head's .* state must be contiguous"):
        transposed = torch.zeros(2, HV, K, V).transpose(2, 3)  # right shape, wrong block layout
        capture_gdn_states(h, transposed, k, v_new, g, caps())


def test_chunk_length_is_sglangs() -> None:
    """The geometry's chunk (kernels/gdn_capture.py) is the one SGLang's FLA prefill uses."""
    chunk = importlib.import_module("sglang.kernels.ops.attention.fla.chunk")
    delta_h = importlib.import_module("sglang.kernels.ops.attention.fla.chunk_delta_h")
    assert chunk.CHUNK_SIZE == delta_h.CHUNK_SIZE == GDN_CHUNK
