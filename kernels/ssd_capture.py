"""Mamba2 SSM states at exact positions of a packed prefill, on the tensor cores, from the scan.

SGLang's chunked SSD scan computes, per chunk of ``chunk`` packed tokens, the processed step
sizes ``dt`` and their decay cumsum ``cs_j = sum_{i <= j} dt_i * A`` (inclusive, restarting at
every chunk), and the state entering every chunk. A capture whose tokens ``[s, s + n)`` lie in
one chunk, starting from a state ``h0`` at ``s``, is then one masked matrix product per head::

    h = exp(cs_end - cs_before) * h0 + X^T diag(w) B      w_t = exp(cs_end - cs_t) * dt_t

with ``X`` the ``n x headdim`` inputs, ``B`` the ``n x dstate`` inputs of the head's group,
``cs_end = cs_{s + n - 1}`` and ``cs_before = cs_{s - 1}`` (0 at a chunk start). ``h0`` is the
scan's state entering the chunk (``s`` on a chunk boundary), the row's initial state (``s`` =
the row's first token) or zero. Nothing is recomputed: ``dt`` and ``cs`` are the scan's own
tensors, so the capture uses the exact step sizes the prefill used.

One launch serves every capture of a layer: grid (chain, head, state tile). The captures that
start from one state (one chunk, several checkpoints in it) form a chain: its program reads the
start state and each token once, and stores the running state at every capture's end, which
is ``h_j = exp(cs_j - cs_{j-1}) * h_{j-1} + X_(j-1, j]^T diag(w) B`` with ``w`` decayed to the
j-th end. The capture is latency-bound, not bandwidth-bound (an H200 runs it no faster than an
H100), so what counts is dependent memory round trips per program: chains removed 24 % of the
time at 126 captures in 8k tokens (bench/RESULTS.md). Accumulation is fp32; float32 operands go
through the tensor cores as ``tf32x3`` by default (three TF32 products, close to fp32: the
scan's own float32 dots use plain TF32), bf16/fp16 inputs are widened to float32 first so only
the inputs' own rounding remains.

The tile is autotuned per (head dim, state size) on the first launch, among the three of least
geometric-mean time over three packings in an 18-config sweep of the chained kernel on an H200
at Nemotron-H-8B's shapes (scripts/capture_tiles.py, bench/RESULTS.md): 16 tokens per step;
the fastest caps registers at 128 (four programs per SM) and takes ``mma.sync`` (32 rows, below
``wgmma``'s 64). A variant whose tiles spanned two heads of one B group (sharing each B tile)
was 1.1-1.9x slower. Re-running a launch
rewrites the same values, so the tuner's trial runs on the live pool are harmless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

import triton
import triton.language as tl

from jenga_sglang.kernels.checks import (
    check_float,
    check_range,
    check_same_device,
    check_shape,
    check_state_blocks,
    check_unique,
    index_list,
    require,
)

if TYPE_CHECKING:
    import torch

NO_STATE = -1
"""``chunk_src`` / ``row_src`` value: not this source (both ``NO_STATE``: the zero state)."""

CHAIN_FIELDS = ("chunk_src", "row_src", "start")
"""``SsdCaptures``' fields given per chain (the others are per capture)."""

PRECISIONS = ("tf32x3", "tf32", "ieee")


TILES = [
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 16}, num_warps=4, num_stages=2,
                  maxnreg=128),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 16}, num_warps=4, num_stages=2,
                  maxnreg=128),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 16}, num_warps=4, num_stages=3),
]  # fmt: skip


@triton.autotune(configs=TILES, key=["headdim", "dstate"])  # type: ignore[untyped-decorator]
@triton.jit  # type: ignore[untyped-decorator]
def _ssd_capture_kernel(  # type: ignore[no-untyped-def]
    chunk_states,
    row_states,
    out,
    chains,
    chunk_src,
    row_src,
    dst_idx,
    tok_start,
    n_tok,
    x,
    b,
    dt,
    cs,
    s_cs_c,
    s_cs_h,
    s_rs_r,
    s_rs_h,
    s_o_slot,
    s_o_h,
    s_x_t,
    s_x_h,
    s_x_p,
    s_b_t,
    s_b_g,
    s_b_n,
    s_dt_h,
    s_dt_c,
    s_dt_l,
    s_cum_h,
    s_cum_c,
    s_cum_l,
    chunk,
    headdim: tl.constexpr,
    dstate: tl.constexpr,
    heads_per_group,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # Program: one chain of captures (``chains[g]`` to ``chains[g + 1]``: one start state, one
    # chunk, ascending token counts), one head, one state tile. The chain reads its start state
    # and each token once and stores the running state at every capture's end. Its start and
    # source are indexed by the chain, not by its first capture: one dependent round trip less
    # before the state and the tokens stream in (the kernel waits on memory, not bandwidth).
    g = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    tiles_n = tl.cdiv(dstate, BLOCK_N)
    offs_m = (tl.program_id(2) // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (tl.program_id(2) % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < headdim
    mask_n = offs_n < dstate
    tile = mask_m[:, None] & mask_n[None, :]

    j0 = tl.load(chains + g)
    j1 = tl.load(chains + g + 1)
    start = tl.load(tok_start + g).to(tl.int64)
    c = start // chunk  # every token of the chain lies in this chunk (launcher's contract)
    first = start - c * chunk
    dt_base = dt + head * s_dt_h + c * s_dt_c
    cs_base = cs + head * s_cum_h + c * s_cum_c
    cs_done = tl.load(cs_base + (first - 1) * s_cum_l, mask=first > 0, other=0.0).to(tl.float32)

    # The start state first (a chunk's from the scan, a row's initial state, or none; masked
    # loads), so its read is in flight while the tokens stream in.
    k_src = tl.load(chunk_src + g).to(tl.int64)
    r_src = tl.load(row_src + g).to(tl.int64)
    # A head's state is one contiguous (headdim, dstate) block in every state tensor (the
    # launcher checks it): tile offsets are compile-time constants, fewer address registers.
    s_tile = offs_m[:, None] * dstate + offs_n[None, :]
    acc = tl.load(
        chunk_states + tl.maximum(k_src, 0) * s_cs_c + head * s_cs_h + s_tile,
        mask=tile & (k_src >= 0),
        other=0.0,
    ).to(tl.float32)
    acc += tl.load(
        row_states + tl.maximum(r_src, 0) * s_rs_r + head * s_rs_h + s_tile,
        mask=tile & (r_src >= 0),
        other=0.0,
    ).to(tl.float32)
    x_base = x + head * s_x_h + offs_m[:, None] * s_x_p
    b_base = b + (head // heads_per_group) * s_b_g + offs_n[None, :] * s_b_n
    done = first  # local position of the next token to apply
    for j in range(j0, j1):
        last = first + tl.load(n_tok + j).to(tl.int64)  # local positions [first, last)
        cs_end = tl.load(cs_base + (last - 1) * s_cum_l, mask=last > 0, other=0.0)
        cs_end = cs_end.to(tl.float32)
        acc = acc * tl.exp(cs_end - cs_done)
        for k0 in range(done, last, BLOCK_K):
            local = k0 + offs_k
            in_range = local < last
            tok = c * chunk + local
            x_mask = mask_m[:, None] & in_range[None, :]
            xv = tl.load(x_base + tok[None, :] * s_x_t, mask=x_mask, other=0.0).to(tl.float32)
            b_mask = in_range[:, None] & mask_n[None, :]
            bv = tl.load(b_base + tok[:, None] * s_b_t, mask=b_mask, other=0.0).to(tl.float32)
            cs_t = tl.load(cs_base + local * s_cum_l, mask=in_range, other=0.0).to(tl.float32)
            dt_t = tl.load(dt_base + local * s_dt_l, mask=in_range, other=0.0).to(tl.float32)
            w = tl.where(in_range, tl.exp(cs_end - cs_t) * dt_t, 0.0)
            acc += tl.dot(xv, bv * w[:, None], input_precision=PRECISION)
        dst = tl.load(dst_idx + j).to(tl.int64)
        o_ptr = out + dst * s_o_slot + head * s_o_h + s_tile
        tl.store(o_ptr, acc.to(out.dtype.element_ty), mask=tile)
        done = last
        cs_done = cs_end


@dataclass(frozen=True)
class SsdCaptures:
    """One launch's captures in chains (1-D int64 tensors).

    Captures that start from one state form a chain (``chain_order`` makes them): ``chains``
    holds where each chain begins among the captures, then their number. Per chain:
    ``chunk_src[g]``, the chunk whose entering state starts it, or ``NO_STATE``; ``row_src[g]``,
    the row whose initial state starts it, or ``NO_STATE`` (at most one of the two is set;
    neither: the zero state); ``start[g]``, its first packed token. Per capture, in chain order:
    ``dst[i]``, the slot of ``out`` (distinct); ``count[i]``, the tokens ``[start, start +
    count)`` it applies, inside one chunk, ascending within a chain. ``of`` builds them from the
    geometry's per-capture lists.
    """

    chunk_src: torch.Tensor
    row_src: torch.Tensor
    dst: torch.Tensor
    start: torch.Tensor
    count: torch.Tensor
    chains: torch.Tensor

    @classmethod
    def of(
        cls,
        chunk_src: Sequence[int],
        row_src: Sequence[int],
        start: Sequence[int],
        count: Sequence[int],
        chains: Sequence[int],
        dst: torch.Tensor,
    ) -> SsdCaptures:
        """From per-capture host lists in chain order (``chain_order``; the binding's
        geometry) and the destinations, on ``dst``'s device (copied without a sync)."""
        import torch

        def ids(values: Sequence[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64).to(dst.device, non_blocking=True)

        heads = chains[:-1]
        k_src, r_src, first = (ids([v[a] for a in heads]) for v in (chunk_src, row_src, start))
        return cls(k_src, r_src, dst, first, ids(count), ids(chains))


def chain_order(
    chunk_src: Sequence[int], row_src: Sequence[int], start: Sequence[int], count: Sequence[int]
) -> tuple[list[int], list[int]]:
    """(order, chains): the captures reordered into chains (``order[k]`` is the k-th capture
    launched) and the chains' offsets into that order, as ``SsdCaptures`` takes them. Captures
    of one start state and start (one chunk) form one chain, so a program reads that state
    and each token once for all of them."""
    order = sorted(range(len(start)), key=lambda i: (start[i], chunk_src[i], row_src[i], count[i]))
    chains = [0]
    for k in range(1, len(order)):
        i, prev = order[k], order[k - 1]
        if (start[i], chunk_src[i], row_src[i]) != (start[prev], chunk_src[prev], row_src[prev]):
            chains.append(k)
    if order:
        chains.append(len(order))
    return order, chains


def check_ssd_captures(
    chunk_src: list[int],
    row_src: list[int],
    dst: list[int],
    start: list[int],
    count: list[int],
    chains: list[int],
    sizes: tuple[int, int, int],
    tokens: int,
    chunk: int,
) -> None:
    """Host-side checks of one launch's indices; ``sizes`` = (chunks, rows, out slots). A caller
    that builds the indices on the host checks them here once and launches with
    ``checked=True``, which spares the device-to-host copy of every launch."""
    n = len(dst)
    for name, values in (("chunk_src", chunk_src), ("row_src", row_src), ("start", start)):
        require(len(values) == n, f"{name}: expected {n} entries, got {len(values)}")
    require(len(count) == n, f"count: expected {n} entries, got {len(count)}")
    check_range("chunk_src", chunk_src, 0, sizes[0], allow=(NO_STATE,))
    check_range("row_src", row_src, 0, sizes[1], allow=(NO_STATE,))
    check_range("dst", dst, 0, sizes[2])
    check_unique("dst", dst)
    for i, (k, r, s, c) in enumerate(zip(chunk_src, row_src, start, count, strict=True)):
        require(k == NO_STATE or r == NO_STATE, f"capture {i}: both a chunk and a row source")
        require(c >= 0 and s >= 0 and s + c <= tokens, f"capture {i}: tokens [{s}, {s + c})")
        require(
            c == 0 or s // chunk == (s + c - 1) // chunk,
            f"capture {i}: tokens [{s}, {s + c}) cross a boundary of chunk {chunk}",
        )
        require(k == NO_STATE or s == k * chunk, f"capture {i}: chunk {k} state but start {s}")
    _check_chains(chunk_src, row_src, start, count, chains)


def _check_chains(
    chunk_src: list[int], row_src: list[int], start: list[int], count: list[int], chains: list[int]
) -> None:
    _check_offsets(chains, len(start))
    for a, b in pairwise(chains):
        for i in range(a + 1, b):
            same = (chunk_src[i], row_src[i], start[i]) == (chunk_src[a], row_src[a], start[a])
            require(same, f"capture {i}: not the start state and start of its chain's first {a}")
            require(count[i] >= count[i - 1], f"capture {i}: count below its chain predecessor's")


def _check_offsets(chains: list[int], n: int) -> None:
    """`chains` cuts `n` captures into chains: ascending offsets from 0 to `n`."""
    require(
        chains[:1] == [0] and chains[-1:] == [n] and all(a < b for a, b in pairwise(chains)),
        f"chains: expected ascending offsets from 0 to {n}, got {chains[:8]}",
    )


def _check_tensors(
    chunk_states: torch.Tensor,
    row_states: torch.Tensor | None,
    out: torch.Tensor,
    x: torch.Tensor,
    b: torch.Tensor,
    dt: torch.Tensor,
    cs: torch.Tensor,
) -> None:
    require(x.dim() == 3, f"x: expected (tokens, nheads, headdim), got shape {tuple(x.shape)}")
    tokens, nheads, headdim = x.shape
    require(b.dim() == 3 and b.shape[0] == tokens, f"B: expected ({tokens}, ngroups, dstate)")
    ngroups, dstate = b.shape[1], b.shape[2]
    require(ngroups > 0 and nheads % ngroups == 0, f"nheads={nheads} % ngroups={ngroups} != 0")
    require(dt.dim() == 3 and dt.shape[0] == nheads, "dt: expected (nheads, chunks, chunk)")
    check_shape("dA_cumsum", cs, tuple(dt.shape))
    require(dt.shape[1] * dt.shape[2] >= tokens, "dt: fewer chunk positions than tokens")
    tensors = {"chunk_states": chunk_states, "out": out, "x": x, "B": b, "dt": dt, "cs": cs}
    if row_states is not None:
        tensors["row_states"] = row_states
    for name, s in tensors.items():
        if name in ("chunk_states", "row_states", "out"):
            require(s.dim() == 4, f"{name}: expected (n, nheads, headdim, dstate)")
            check_shape(name, s[0:0], (0, nheads, headdim, dstate))
            check_state_blocks(name, s)
        check_float(name, s)
    check_same_device(tensors)


def capture_ssd_states(
    chunk_states: torch.Tensor,
    row_states: torch.Tensor | None,
    out: torch.Tensor,
    x: torch.Tensor,
    b: torch.Tensor,
    dt: torch.Tensor,
    cs: torch.Tensor,
    caps: SsdCaptures,
    *,
    checked: bool = False,
    precision: str = "tf32x3",
) -> None:
    """Write each capture's SSM state into ``out[caps.dst[i]]`` (one launch).

    Shapes (``T`` packed tokens, ``H`` heads, ``P`` head dim, ``N`` d_state, ``G`` groups,
    ``C`` chunks of ``L`` tokens, as the scan made them): ``chunk_states`` (C, H, P, N), the
    state entering each chunk; ``row_states`` (rows, H, P, N) or None; ``out`` (slots, H, P, N),
    a pool view (any slot and head strides; each head's (P, N) block contiguous, in all
    three); ``x`` (T, H, P); ``b`` (T, G, N); ``dt`` and ``cs`` (H, C, L): the scan's
    processed step sizes and their per-chunk inclusive cumsum times ``A``. Raises
    ``ValueError`` before launching on any inconsistency; ``checked=True``: the caller
    validated the index values with ``check_ssd_captures`` (shapes are still checked).
    """
    require(precision in PRECISIONS, f"precision {precision!r} is not one of {PRECISIONS}")
    _check_tensors(chunk_states, row_states, out, x, b, dt, cs)
    n = caps.dst.numel()
    chunk = dt.shape[2]
    if not checked:
        chains = index_list("chains", caps.chains, caps.chains.numel())
        _check_offsets(chains, n)
        g = len(chains) - 1
        k_src, r_src, first = (index_list(k, getattr(caps, k), g) for k in CHAIN_FIELDS)
        dst, count = (index_list(k, getattr(caps, k), n) for k in ("dst", "count"))
        # per capture, as the host-side check takes them
        of_chain = [c for c, (a, b) in enumerate(pairwise(chains)) for _ in range(a, b)]
        k_src, r_src, start = ([v[c] for c in of_chain] for v in (k_src, r_src, first))
        rows = row_states.shape[0] if row_states is not None else 0
        sizes = (chunk_states.shape[0], rows, out.shape[0])
        check_ssd_captures(k_src, r_src, dst, start, count, chains, sizes, x.shape[0], chunk)
        if out.untyped_storage().data_ptr() == chunk_states.untyped_storage().data_ptr():
            raise ValueError("out shares storage with chunk_states")
    if n == 0:
        return
    _, nheads, headdim = x.shape
    dstate = b.shape[2]

    def grid(meta: dict[str, int]) -> tuple[int, int, int]:
        m, k = triton.cdiv(headdim, meta["BLOCK_M"]), triton.cdiv(dstate, meta["BLOCK_N"])
        return (caps.chains.numel() - 1, nheads, m * k)

    rows_t = row_states if row_states is not None else chunk_states
    _ssd_capture_kernel[grid](
        chunk_states, rows_t, out,
        caps.chains, caps.chunk_src, caps.row_src, caps.dst, caps.start, caps.count,
        x, b, dt, cs,
        *chunk_states.stride()[:2], *rows_t.stride()[:2], *out.stride()[:2],
        *x.stride(), *b.stride(), *dt.stride(), *cs.stride(),
        chunk, headdim, dstate, nheads // b.shape[1], PRECISION=precision,
    )  # fmt: skip
