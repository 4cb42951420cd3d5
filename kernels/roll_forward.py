"""Roll a Mamba2 SSM (temporal) state forward by a few tokens, exactly, for a batch of requests.

Marconi checkpoints the SSM state at a branch point ``p`` that is rarely a chunk boundary of the
chunked SSD scan. The scan already materialises the state at every chunk boundary ``c``; this
kernel applies the remaining ``r = p - c`` recurrence steps (``r < chunk_size``, possibly 0) with
the same ``dt``/``A``/``B``/``x`` the prefill used, and lands exactly on ``p``::

    dt_t = clamp(softplus(dt_t + dt_bias), dt_min, dt_max)     # as the scan preprocesses dt
    h    = exp(dt_t * A[h]) * h + dt_t * x_t (outer) B_t[group(h)]

One launch serves many requests, each with its own source state, token range in the packed
(varlen) inputs and destination slot. Accumulation is fp32 whatever the storage dtypes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import triton
import triton.language as tl

from jenga_sglang.kernels.checks import (
    check_float,
    check_range,
    check_same_device,
    check_shape,
    check_unique,
    index_list,
    require,
)

if TYPE_CHECKING:
    import torch

NO_SOURCE = -1
"""``src_idx`` value meaning "start from the zero state" (the request starts at token 0)."""


@triton.jit  # type: ignore[untyped-decorator]
def _roll_forward_kernel(  # type: ignore[no-untyped-def]
    state_in,
    src_idx,
    state_out,
    dst_idx,
    x,
    dt,
    b,
    a,
    dt_bias,
    tok_start,
    n_tok,
    s_in_slot,
    s_in_h,
    s_in_p,
    s_in_n,
    s_out_slot,
    s_out_h,
    s_out_p,
    s_out_n,
    s_x_t,
    s_x_h,
    s_x_p,
    s_dt_t,
    s_dt_h,
    s_b_t,
    s_b_g,
    s_b_n,
    nheads,
    headdim,
    dstate,
    heads_per_group,
    dt_min,
    dt_max,
    HAS_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Rows are flattened (head, head_dim) pairs, so small heads share one program.
    req = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_n = tl.arange(0, BLOCK_N)
    mask_r = rows < nheads * headdim
    mask_n = offs_n < dstate
    mask = mask_r[:, None] & mask_n[None, :]
    head = tl.minimum(rows // headdim, nheads - 1)
    offs_p = rows % headdim
    group = head // heads_per_group

    src = tl.load(src_idx + req).to(tl.int64)
    dst = tl.load(dst_idx + req).to(tl.int64)
    start = tl.load(tok_start + req).to(tl.int64)
    count = tl.load(n_tok + req)
    # A negative source means the zero state; clamp the address, mask the load.
    row_in = head * s_in_h + offs_p * s_in_p
    in_ptr = state_in + tl.maximum(src, 0) * s_in_slot + row_in[:, None] + offs_n[None, :] * s_in_n
    h = tl.load(in_ptr, mask=mask & (src >= 0), other=0.0).to(tl.float32)

    a_h = tl.load(a + head).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(dt_bias + head).to(tl.float32)
    x_ptr = x + head * s_x_h + offs_p * s_x_p
    dt_ptr = dt + head * s_dt_h
    b_ptr = b + group[:, None] * s_b_g + offs_n[None, :] * s_b_n
    for i in range(0, count):
        tok = start + i
        d = tl.load(dt_ptr + tok * s_dt_t).to(tl.float32)
        if HAS_BIAS:
            d = d + bias
        if SOFTPLUS:
            d = tl.where(d <= 20.0, tl.log(tl.exp(d) + 1.0), d)
        d = tl.minimum(tl.maximum(d, dt_min), dt_max)
        xv = tl.load(x_ptr + tok * s_x_t, mask=mask_r, other=0.0).to(tl.float32)
        bv = tl.load(b_ptr + tok * s_b_t, mask=mask, other=0.0).to(tl.float32)
        h = h * tl.exp(d * a_h)[:, None] + (xv * d)[:, None] * bv

    row_out = head * s_out_h + offs_p * s_out_p
    out_ptr = state_out + dst * s_out_slot + row_out[:, None] + offs_n[None, :] * s_out_n
    tl.store(out_ptr, h.to(state_out.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class DtProcessing:
    """How the prefill turned raw ``dt`` into the step size (mirror the scan's arguments)."""

    dt_bias: torch.Tensor | None = None
    softplus: bool = False
    dt_min: float = 0.0
    dt_max: float = math.inf


def _check_inputs(
    state_in: torch.Tensor,
    state_out: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    proc: DtProcessing,
) -> None:
    require(x.dim() == 3, f"x: expected (tokens, nheads, headdim), got shape {tuple(x.shape)}")
    tokens, nheads, headdim = x.shape
    require(b.dim() == 3, f"B: expected (tokens, ngroups, dstate), got shape {tuple(b.shape)}")
    ngroups, dstate = b.shape[1], b.shape[2]
    check_shape("B", b, (tokens, ngroups, dstate))
    check_shape("dt", dt, (tokens, nheads))
    check_shape("A", a, (nheads,))
    require(ngroups > 0 and nheads % ngroups == 0, f"nheads={nheads} % ngroups={ngroups} != 0")
    for name, s in (("state_in", state_in), ("state_out", state_out)):
        require(s.dim() == 4, f"{name}: expected (slots, nheads, headdim, dstate)")
        check_shape(name, s[0:0], (0, nheads, headdim, dstate))
    tensors = {"state_in": state_in, "state_out": state_out, "x": x, "dt": dt, "B": b, "A": a}
    if proc.dt_bias is not None:
        check_shape("dt_bias", proc.dt_bias, (nheads,))
        tensors["dt_bias"] = proc.dt_bias
    for name, t in tensors.items():
        check_float(name, t)
    check_same_device(tensors)
    require(proc.dt_min <= proc.dt_max, f"dt_min={proc.dt_min} > dt_max={proc.dt_max}")


def check_roll_requests(
    src: list[int],
    dst: list[int],
    starts: list[int],
    counts: list[int],
    slots: tuple[int, int],
    tokens: int,
    in_place: bool = False,
) -> None:
    """Host-side checks of one launch's per-request indices (``slots`` = rows of state_in and
    state_out). A caller that builds the indices on the host checks them here once and then
    launches with ``checked=True``, which spares the device-to-host copy of every launch."""
    n = len(src)
    for name, values in (("dst_idx", dst), ("tok_start", starts), ("n_tok", counts)):
        require(len(values) == n, f"{name}: expected {n} entries, got {len(values)}")
    check_range("src_idx", src, 0, slots[0], allow=(NO_SOURCE,))
    check_range("dst_idx", dst, 0, slots[1])
    check_unique("dst_idx", dst)
    for i, (s, c) in enumerate(zip(starts, counts, strict=True)):
        require(c >= 0, f"n_tok[{i}] = {c} is negative")
        require(
            s >= 0 and s + c <= tokens, f"request {i}: tokens [{s}, {s + c}) not in [0, {tokens})"
        )
    if in_place:
        # In place: a slot one request writes must not be one another request reads.
        for i, d in enumerate(dst):
            clash = [j for j, s in enumerate(src) if s == d and j != i]
            if clash:
                raise ValueError(f"dst_idx[{i}] = {d} is read as src_idx by request {clash[0]}")


def _check_requests(
    state_in: torch.Tensor,
    state_out: torch.Tensor,
    tokens: int,
    idx: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    n = idx[0].numel()
    names = ("src_idx", "dst_idx", "tok_start", "n_tok")
    src, dst, starts, counts = (index_list(k, t, n) for k, t in zip(names, idx, strict=True))
    same = state_in.untyped_storage().data_ptr() == state_out.untyped_storage().data_ptr()
    slots = (state_in.shape[0], state_out.shape[0])
    check_roll_requests(src, dst, starts, counts, slots, tokens, in_place=same)


def roll_forward_ssm_states(
    state_in: torch.Tensor,
    src_idx: torch.Tensor,
    state_out: torch.Tensor,
    dst_idx: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    tok_start: torch.Tensor,
    n_tok: torch.Tensor,
    proc: DtProcessing | None = None,
    *,
    checked: bool = False,
) -> None:
    """Advance request ``i``'s state by ``n_tok[i]`` tokens and store it in a destination slot.

    Shapes (``T`` packed tokens, ``H`` heads, ``P`` head dim, ``N`` d_state, ``G`` groups):
    ``state_in`` / ``state_out``: (slots, H, P, N), any strides and float dtypes (fp32 typical);
    ``x``: (T, H, P); ``dt``: (T, H) raw, processed as ``proc`` says; ``b``: (T, G, N); ``a``: (H,).
    Per request ``i`` (int32/int64 1-D tensors of one length): ``src_idx[i]`` slot of the start
    state in ``state_in`` (``NO_SOURCE`` = zeros), ``dst_idx[i]`` slot in ``state_out`` (distinct),
    ``tok_start[i]`` first packed token to apply, ``n_tok[i]`` how many (0 copies the state).
    Raises ``ValueError`` on any inconsistent argument before launching. ``checked=True``: the
    caller validated the index values with ``check_roll_requests`` (shapes are still checked).
    """
    proc = proc or DtProcessing()
    _check_inputs(state_in, state_out, x, dt, b, a, proc)
    idx = (src_idx, dst_idx, tok_start, n_tok)
    if not checked:
        _check_requests(state_in, state_out, x.shape[0], idx)
    n = src_idx.numel()
    if n == 0:
        return
    _, nheads, headdim = x.shape
    ngroups, dstate = b.shape[1], b.shape[2]
    block_n = triton.next_power_of_2(dstate)
    # Keep the fp32 state tile at <= 8K elements per program (registers on a GPU).
    block_r = max(1, min(triton.next_power_of_2(nheads * headdim), 8192 // block_n))
    grid = (n, triton.cdiv(nheads * headdim, block_r))
    _roll_forward_kernel[grid](
        state_in,
        src_idx,
        state_out,
        dst_idx,
        x,
        dt,
        b,
        a,
        proc.dt_bias if proc.dt_bias is not None else a,
        tok_start,
        n_tok,
        *state_in.stride(),
        *state_out.stride(),
        *x.stride(),
        *dt.stride(),
        *b.stride(),
        nheads,
        headdim,
        dstate,
        nheads // ngroups,
        float(proc.dt_min),
        float(proc.dt_max),
        HAS_BIAS=proc.dt_bias is not None,
        SOFTPLUS=proc.softplus,
        BLOCK_R=block_r,
        BLOCK_N=block_n,
    )
