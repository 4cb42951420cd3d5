"""Exactness of the chunked SSM capture (kernels/ssd_capture.py) on SGLang's own scan outputs.

A packed prefill of three rows (one resumed from a cached state, two starting mid-chunk) runs
through SGLang's vendored Mamba2 scan as its mixer calls it; every capture, planned by the
binding's geometry, is computed from the scan's chunk states, processed dt and decay cumsum, and
compared with a float64 recurrence from the row's start state, and with SGLang's scan of the
prefix alone. Triton interpreter on CPU.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import triton_cpu  # noqa: F401  (interpreter patches before the kernels import triton)

from jenga_sglang.binding.cache.captures import Capture
from jenga_sglang.binding.capture.geometry import Geometry, plan_mamba2
from jenga_sglang.kernels.ssd_capture import (
    NO_STATE,
    SsdCaptures,
    capture_ssd_states,
    chain_order,
    check_ssd_captures,
)

pytestmark = [pytest.mark.exactness, pytest.mark.sglang]

H, P, N, G, CHUNK = 4, 8, 16, 2, 8
ROWS = (5, 19, 13)  # packed at 0, 5, 24: rows 1 and 2 start mid-chunk
PREFIX = (0, 6, 0)  # row 1 resumes from a cached state
DT_LIMIT = (0.02, 0.8)
FP32_TOL = 1e-5


@dataclass(frozen=True)
class Batch:
    """One packed prefill's scan inputs (dt raw, as the mixer passes it)."""

    x: torch.Tensor  # (T, H, P)
    dt: torch.Tensor  # (T, H)
    b: torch.Tensor  # (T, G, N)
    c: torch.Tensor
    a: torch.Tensor  # (H,)
    bias: torch.Tensor  # (H,)
    init: torch.Tensor  # (rows, H, P, N): zero for rows without a prefix

    @property
    def cu(self) -> list[int]:
        out = [0]
        for n in ROWS:
            out.append(out[-1] + n)
        return out


@functools.cache
def make_batch(dtype: torch.dtype) -> Batch:
    """Cached: tests must not modify the returned tensors. bf16 values are rounded once; the
    scan then sees them as float32 (the interpreter's bf16 dot computes on raw bits)."""
    g = torch.Generator().manual_seed(0)
    t = sum(ROWS)
    init = torch.randn(len(ROWS), H, P, N, generator=g)
    init[[i for i, p in enumerate(PREFIX) if p == 0]] = 0
    return Batch(
        x=torch.randn(t, H, P, generator=g).to(dtype),
        dt=(torch.randn(t, H, generator=g) * 1.5).to(dtype),
        b=torch.randn(t, G, N, generator=g).to(dtype),
        c=torch.randn(t, G, N, generator=g).to(dtype),
        a=-(torch.rand(H, generator=g) + 0.5),
        bias=torch.linspace(-1.0, 1.0, H),
        init=init,
    )


def sglang_scan(batch: Batch, cu: list[int], init: torch.Tensor | None) -> tuple[Any, ...]:
    """SGLang's `_mamba_chunk_scan_combined_fwd` over rows `cu`, as its Mamba2 mixer calls it;
    returns (dt, dA_cumsum, chunk states, varlen states), batch dimension dropped."""
    from sglang.kernels.ops.mamba.triton_ops.ssd_combined import _mamba_chunk_scan_combined_fwd
    from sglang.srt.layers.attention.mamba.mamba2_metadata import Mamba2Metadata

    cu_t = torch.tensor(cu, dtype=torch.int32)
    t = cu[-1]
    seq_idx = torch.repeat_interleave(torch.arange(len(cu) - 1, dtype=torch.int32), cu_t.diff())
    indices, offsets = Mamba2Metadata._query_start_loc_to_chunk_indices_offsets(cu_t, CHUNK, t)
    x, dt, b, c = (v[:t].float()[None] for v in (batch.x, batch.dt, batch.b, batch.c))
    res = _mamba_chunk_scan_combined_fwd(
        x, dt, batch.a, b, c, CHUNK, dt_bias=batch.bias, initial_states=init,
        seq_idx=seq_idx[None], chunk_indices=indices, chunk_offsets=offsets, cu_seqlens=cu_t,
        dt_softplus=True, dt_limit=DT_LIMIT, out=torch.empty_like(x),
    )  # fmt: skip
    _, dt_out, cumsum, states, _, varlen, _ = res
    return dt_out[0], cumsum[0], states[0], varlen


@functools.cache
def full_scan(dtype: torch.dtype) -> tuple[Any, ...]:
    batch = make_batch(dtype)
    return sglang_scan(batch, batch.cu, batch.init)


def exact_states(batch: Batch, row: int) -> torch.Tensor:
    """Float64 recurrence over row `row` from its start state: (len + 1, H, P, N)."""
    lo, hi = batch.cu[row], batch.cu[row + 1]
    x, b = batch.x[lo:hi].double(), batch.b[lo:hi].double().repeat_interleave(H // G, dim=1)
    dt = torch.nn.functional.softplus(batch.dt[lo:hi].double() + batch.bias.double())
    dt = dt.clamp(*DT_LIMIT)
    h = batch.init[row].double()
    out = [h]
    for i in range(hi - lo):
        h = torch.exp(dt[i] * batch.a.double())[:, None, None] * h
        h = h + (dt[i][:, None] * x[i])[:, :, None] * b[i][:, None, :]
        out.append(h)
    return torch.stack(out)


def every_position() -> tuple[Capture, ...]:
    caps, slot = [], 0
    for row, n in enumerate(ROWS):
        for offset in range(1, n + 1):
            caps.append(Capture(row, offset, slot))
            slot += 1
    return tuple(caps)


def strided_pool(slots: int) -> torch.Tensor:
    """A state pool whose slot stride exceeds one state (as the Jenga pool's views), NaN-filled."""
    flat = torch.full((slots, H * P * N + 40), float("nan"))
    return flat[:, 40:].view(slots, H, P, N)


def launch(geo: Geometry, dtype: torch.dtype, out: torch.Tensor, **kw: Any) -> None:
    batch = make_batch(dtype)
    dt, cumsum, states, _ = full_scan(dtype)
    caps = SsdCaptures.of(geo.chunk_src, geo.row_src, geo.ssm_start, geo.ssm_count,
                          geo.ssm_chains, torch.tensor(geo.dst))  # fmt: skip
    capture_ssd_states(states, batch.init, out, batch.x, batch.b, dt, cumsum, caps, **kw)


def captured(dtype: torch.dtype) -> tuple[tuple[Capture, ...], torch.Tensor]:
    caps = every_position()
    geo = plan_mamba2(caps, list(PREFIX), list(ROWS), CHUNK, len(caps))
    assert geo.reads_row_states and set(geo.chunk_src) != {NO_STATE}
    out = strided_pool(len(caps))
    launch(geo, dtype, out)
    return caps, out


def test_every_position_matches_the_float64_recurrence() -> None:
    batch = make_batch(torch.float32)
    caps, out = captured(torch.float32)
    for cap in caps:
        want = exact_states(batch, cap.row)[cap.offset]
        assert (out[cap.slot].double() - want).abs().max() <= FP32_TOL, cap


def test_captures_equal_sglangs_scan_of_the_prefix_alone() -> None:
    batch = make_batch(torch.float32)
    caps, out = captured(torch.float32)
    # One interpreted scan per row, each over the rows packed up to the captures' prefixes.
    for row in range(len(ROWS)):
        mine = [c for c in caps if c.row == row and c.offset in (1, 3, 8, 11, ROWS[row])]
        cu = [0]
        for c in mine:
            cu.append(cu[-1] + c.offset)
        lo = batch.cu[row]
        rows = [batch_slice(batch, lo, c.offset) for c in mine]
        packed = Batch(
            *(torch.cat([getattr(r, f) for r in rows]) for f in ("x", "dt", "b", "c")),
            batch.a, batch.bias, batch.init[row].expand(len(mine), H, P, N).contiguous(),
        )  # fmt: skip
        *_, varlen = sglang_scan(packed, cu, packed.init)
        for i, c in enumerate(mine):
            assert (out[c.slot] - varlen[i]).abs().max() <= FP32_TOL, c


def batch_slice(batch: Batch, lo: int, n: int) -> Batch:
    cut = [getattr(batch, f)[lo : lo + n] for f in ("x", "dt", "b", "c")]
    return Batch(*cut, batch.a, batch.bias, batch.init)


def test_bf16_activations_only_leave_fp32_rounding() -> None:
    batch = make_batch(torch.bfloat16)
    caps, out = captured(torch.bfloat16)
    worst = max(
        float((out[c.slot].double() - exact_states(batch, c.row)[c.offset]).abs().max())
        for c in caps
    )
    assert worst <= 1e-4, worst  # same bf16 values in fp64: fp32 accumulation only


def test_other_slots_and_bf16_slots() -> None:
    caps = (Capture(1, 7, 2), Capture(2, 13, 0))
    geo = plan_mamba2(caps, list(PREFIX), list(ROWS), CHUNK, 3)
    out = torch.zeros(3, H, P, N, dtype=torch.bfloat16)
    launch(geo, torch.float32, out, precision="tf32")
    batch = make_batch(torch.float32)
    assert out[1].abs().max() == 0  # untouched
    for cap in caps:
        want = exact_states(batch, cap.row)[cap.offset]
        assert (out[cap.slot].double() - want).abs().max() <= 0.01 * want.abs().max(), cap


def test_head_strided_pool_and_chains() -> None:
    """A pool whose heads are not packed (padding between them) takes the runtime head stride,
    and chains of several captures per chunk write every member."""
    caps = every_position()
    geo = plan_mamba2(caps, list(PREFIX), list(ROWS), CHUNK, len(caps))
    chains = geo.ssm_chains
    assert len(chains) - 1 < len(caps)
    assert max(b - a for a, b in itertools.pairwise(chains)) == CHUNK  # a whole chunk's chain
    flat = torch.full((len(caps), H, P * N + 24), float("nan"))
    out = flat[:, :, 24:].view(len(caps), H, P, N)
    launch(geo, torch.float32, out)
    batch = make_batch(torch.float32)
    for cap in caps:
        want = exact_states(batch, cap.row)[cap.offset]
        assert (out[cap.slot].double() - want).abs().max() <= FP32_TOL, cap


def test_chain_order() -> None:
    # two captures of chunk 1, one of row 0's start state, one of chunk 1 at another start
    order, chains = chain_order([1, NO_STATE, 1, 1], [NO_STATE, 0, NO_STATE, NO_STATE],
                                [8, 0, 8, 8], [5, 3, 2, 0])  # fmt: skip
    assert order == [1, 3, 2, 0] and chains == [0, 1, 4]
    assert chain_order([], [], [], []) == ([], [0])


def test_bad_arguments_raise_before_launching() -> None:
    batch = make_batch(torch.float32)
    dt, cumsum, states, _ = full_scan(torch.float32)
    out = torch.zeros(2, H, P, N)

    def caps(**over: list[int]) -> SsdCaptures:
        v = {"chunk_src": [1], "row_src": [NO_STATE], "dst": [0], "start": [8], "count": [3],
             "chains": [0, 1]}  # fmt: skip
        v.update(over)
        return SsdCaptures(*(torch.tensor(v[k]) for k in v))

    def run(c: SsdCaptures, **kw: Any) -> None:
        capture_ssd_states(states, batch.init, out, batch.x, batch.b, dt, cumsum, c, **kw)

    run(caps())
    with pytest.raises(ValueError, match="cross a boundary"):
        run(caps(chunk_src=[NO_STATE], start=[6], count=[4]))
    with pytest.raises(ValueError, match="chunk 1 state but start 9"):
        run(caps(start=[9], count=[2]))
    with pytest.raises(ValueError, match="both a chunk and a row"):
        run(caps(row_src=[0]))
    with pytest.raises(ValueError, match=r"dst\[0\] = 2 is out of range"):
        run(caps(dst=[2]))
    with pytest.raises(ValueError, match="precision"):
        run(caps(), precision="bf16")
    with pytest.raises(ValueError, match="chains: expected ascending offsets"):
        run(caps(chunk_src=[1, 1], row_src=[NO_STATE] * 2, start=[8, 8], chains=[0, 0, 1]))
    with pytest.raises(ValueError, match="chains: expected ascending offsets"):
        run(caps(chains=[0, 2]))
    with pytest.raises(ValueError, match="count below its chain predecessor"):
        run(caps(dst=[0, 1], count=[3, 2], chains=[0, 2]))
    with pytest.raises(ValueError, match="not the start state and start of its chain"):
        check_ssd_captures([1, NO_STATE], [NO_STATE] * 2, [0, 1], [8, 8], [2, 3], [0, 2],
                           (3, 3, 2), 40, CHUNK)  # fmt: skip
    with pytest.raises(ValueError, match="dA_cumsum"):
        capture_ssd_states(states, None, out, batch.x, batch.b, dt, cumsum[:, :1], caps())
    with pytest.raises(ValueError, match=r"out: each head's \(\d+, \d+\) state must be contiguous"):
        transposed = torch.zeros(2, H, N, P).transpose(2, 3)  # right shape, wrong block layout
        capture_ssd_states(states, None, transposed, batch.x, batch.b, dt, cumsum, caps())
