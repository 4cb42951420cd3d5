"""Gated DeltaNet states at exact positions of a packed prefill, from the chunked forward.

SGLang's chunked Gated DeltaNet prefill (its vendored FLA ``chunk_gated_delta_rule_fwd_h``)
cuts every row into chunks of 64 tokens from the row's start and returns ``h``, the state
entering every chunk, and ``v_new = u - w h``, the values the delta rule adds inside the chunk
(``w``, ``u``: the chunk's WY representation). It advances a chunk as::

    h_end = exp(g_last) h + sum_t (v_new_t * exp(g_last - g_t)) (outer) k_t

with ``g`` the gate's log-decay cumsum restarted at the chunk start. ``w`` and ``u`` come from
the inverse of a lower-triangular matrix, so ``u_t`` and ``w_t`` depend only on the chunk's
tokens up to ``t``: the first ``n`` tokens of a chunk give the same ``v_new`` as a chunk that
ends after them. The state after ``n`` tokens of a chunk is therefore the same sum with
``g_{n-1}`` for ``g_last``, over those ``n`` tokens: one masked product per head,
``(V x n) (n x K)``, on the tensor cores, from what the forward already computed.

One launch serves every capture of a layer: grid (capture, value head, state tile). States are
(V, K) per head as the pool stores them; accumulation is fp32. The tile is autotuned per (V, K)
on the first launch among the two fastest at 126 and 64 captures of a 24-config sweep on an
H100 at Qwen3-Next's shapes (scripts/capture_tiles.py, bench/RESULTS.md; at 16 captures the
sweep's times scattered 2-5x between identical launches, so they did not choose): 32 value rows
and 16 tokens per step, the loop being latency-bound (``mma.sync`` on sm_90: a 32-row tile is
below ``wgmma``'s 64). Re-running a launch rewrites the same values, so the tuner's trials are
harmless.
"""

from __future__ import annotations

from dataclasses import dataclass
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
from jenga_sglang.kernels.ssd_capture import PRECISIONS

if TYPE_CHECKING:
    import torch

GDN_CHUNK = 64
"""FLA's chunk length in SGLang's Gated DeltaNet prefill (``fla/chunk.py`` ``CHUNK_SIZE``)."""


TILES = [
    triton.Config({"BLOCK_V": 32, "BLOCK_K": 128, "BLOCK_T": 16}, num_warps=4, num_stages=3,
                  maxnreg=128),
    triton.Config({"BLOCK_V": 32, "BLOCK_K": 128, "BLOCK_T": 16}, num_warps=4, num_stages=3),
]  # fmt: skip


@triton.autotune(configs=TILES, key=["vdim", "kdim"])  # type: ignore[untyped-decorator]
@triton.jit  # type: ignore[untyped-decorator]
def _gdn_capture_kernel(  # type: ignore[no-untyped-def]
    h,
    out,
    src_idx,
    dst_idx,
    tok_start,
    n_tok,
    k,
    v_new,
    g,
    s_h_c,
    s_h_h,
    s_o_slot,
    s_o_h,
    s_k_t,
    s_k_h,
    s_k_d,
    s_v_t,
    s_v_h,
    s_v_d,
    s_g_t,
    s_g_h,
    vdim: tl.constexpr,
    kdim: tl.constexpr,
    heads_per_khead,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PRECISION: tl.constexpr,
):
    cap = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    tiles_k = tl.cdiv(kdim, BLOCK_K)
    offs_v = (tl.program_id(2) // tiles_k) * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_k = (tl.program_id(2) % tiles_k) * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_t = tl.arange(0, BLOCK_T)
    mask_v = offs_v < vdim
    mask_k = offs_k < kdim

    start = tl.load(tok_start + cap).to(tl.int64)
    count = tl.load(n_tok + cap).to(tl.int64)
    g_head = g + head * s_g_h
    g_end = tl.load(g_head + (start + count - 1) * s_g_t, mask=count > 0, other=0.0)
    g_end = g_end.to(tl.float32)

    # The chunk's entering state first, so its read is in flight while the tokens stream in.
    src = tl.load(src_idx + cap).to(tl.int64)
    tile = mask_v[:, None] & mask_k[None, :]
    # A head's (V, K) state is contiguous in h and out (the launcher checks it): the tile
    # offsets are compile-time constants, fewer address registers (145 -> 96 on sm_90).
    s_tile = offs_v[:, None] * kdim + offs_k[None, :]
    h0 = tl.load(h + src * s_h_c + head * s_h_h + s_tile, mask=tile, other=0.0)
    acc = h0.to(tl.float32) * tl.exp(g_end)
    v_base = v_new + head * s_v_h + offs_v[:, None] * s_v_d
    k_base = k + (head // heads_per_khead) * s_k_h + offs_k[None, :] * s_k_d
    for t0 in range(0, count, BLOCK_T):
        in_range = t0 + offs_t < count
        tok = start + t0 + offs_t
        v_mask = mask_v[:, None] & in_range[None, :]
        vv = tl.load(v_base + tok[None, :] * s_v_t, mask=v_mask, other=0.0).to(tl.float32)
        k_mask = in_range[:, None] & mask_k[None, :]
        kk = tl.load(k_base + tok[:, None] * s_k_t, mask=k_mask, other=0.0).to(tl.float32)
        g_t = tl.load(g_head + tok * s_g_t, mask=in_range, other=0.0).to(tl.float32)
        w = tl.where(in_range, tl.exp(g_end - g_t), 0.0)
        acc += tl.dot(vv * w[None, :], kk, input_precision=PRECISION)

    dst = tl.load(dst_idx + cap).to(tl.int64)
    tl.store(out + dst * s_o_slot + head * s_o_h + s_tile, acc.to(out.dtype.element_ty), mask=tile)


@dataclass(frozen=True)
class GdnCaptures:
    """One launch's captures (1-D int tensors of one length): ``src[i]``, the chunk of ``h``
    it starts from; ``dst[i]``, the slot of ``out`` (distinct); ``start[i]``, ``count[i]``: the
    packed tokens ``[start, start + count)`` applied, the first ``count`` tokens of that chunk."""

    src: torch.Tensor
    dst: torch.Tensor
    start: torch.Tensor
    count: torch.Tensor


def check_gdn_captures(
    src: list[int],
    dst: list[int],
    start: list[int],
    count: list[int],
    sizes: tuple[int, int],
    tokens: int,
) -> None:
    """Host-side checks of one launch's indices; ``sizes`` = (chunks of ``h``, out slots). A
    caller that builds the indices on the host checks them here once and launches with
    ``checked=True``."""
    n = len(dst)
    for name, values in (("src", src), ("start", start), ("count", count)):
        require(len(values) == n, f"{name}: expected {n} entries, got {len(values)}")
    check_range("src", src, 0, sizes[0])
    check_range("dst", dst, 0, sizes[1])
    check_unique("dst", dst)
    for i, (s, c) in enumerate(zip(start, count, strict=True)):
        require(0 <= c <= GDN_CHUNK, f"capture {i}: {c} tokens, more than a chunk")
        require(
            s >= 0 and s + c <= tokens, f"capture {i}: tokens [{s}, {s + c}) not in [0, {tokens})"
        )


def _check_tensors(
    h: torch.Tensor, out: torch.Tensor, k: torch.Tensor, v_new: torch.Tensor, g: torch.Tensor
) -> None:
    require(k.dim() == 3, f"k: expected (tokens, key heads, K), got shape {tuple(k.shape)}")
    require(v_new.dim() == 3, f"v_new: expected (tokens, heads, V), got {tuple(v_new.shape)}")
    tokens, kheads, kdim = k.shape
    heads, vdim = v_new.shape[1], v_new.shape[2]
    require(v_new.shape[0] == tokens, f"v_new: {v_new.shape[0]} tokens, k has {tokens}")
    require(heads % kheads == 0, f"heads={heads} % key heads={kheads} != 0")
    check_shape("g", g, (tokens, heads))
    for name, s in (("h", h), ("out", out)):
        require(s.dim() == 4, f"{name}: expected (n, heads, V, K), got {tuple(s.shape)}")
        check_shape(name, s[0:0], (0, heads, vdim, kdim))
        check_state_blocks(name, s)
    tensors = {"h": h, "out": out, "k": k, "v_new": v_new, "g": g}
    for name, t in tensors.items():
        check_float(name, t)
    check_same_device(tensors)


def capture_gdn_states(
    h: torch.Tensor,
    out: torch.Tensor,
    k: torch.Tensor,
    v_new: torch.Tensor,
    g: torch.Tensor,
    caps: GdnCaptures,
    *,
    checked: bool = False,
    precision: str = "tf32x3",
) -> None:
    """Write each capture's state into ``out[caps.dst[i]]`` (one launch).

    Shapes (``T`` packed tokens, ``H`` value heads, ``Hk`` key heads, ``C`` chunks of every
    row): ``h`` (C, H, V, K), the state entering each chunk; ``out`` (slots, H, V, K), a pool
    view (any slot and head strides; each head's (V, K) block contiguous, in both); ``k``
    (T, Hk, K) as the forward used it (l2-normalised); ``v_new`` (T, H, V); ``g`` (T, H), the
    gate cumsum restarted at every chunk. Raises ``ValueError`` before launching on any
    inconsistency; ``checked=True``: the caller validated the index values with
    ``check_gdn_captures`` (shapes are still checked).
    """
    require(precision in PRECISIONS, f"precision {precision!r} is not one of {PRECISIONS}")
    _check_tensors(h, out, k, v_new, g)
    n = caps.dst.numel()
    if not checked:
        src, dst, start, count = (
            index_list(name, getattr(caps, name), n) for name in ("src", "dst", "start", "count")
        )
        check_gdn_captures(src, dst, start, count, (h.shape[0], out.shape[0]), k.shape[0])
        if out.untyped_storage().data_ptr() == h.untyped_storage().data_ptr():
            raise ValueError("out shares storage with h")
    if n == 0:
        return
    heads, vdim, kdim = out.shape[1], out.shape[2], out.shape[3]

    def grid(meta: dict[str, int]) -> tuple[int, int, int]:
        return (n, heads, triton.cdiv(vdim, meta["BLOCK_V"]) * triton.cdiv(kdim, meta["BLOCK_K"]))

    _gdn_capture_kernel[grid](
        h, out, caps.src, caps.dst, caps.start, caps.count, k, v_new, g,
        *h.stride()[:2], *out.stride()[:2], *k.stride(), *v_new.stride(), *g.stride(),
        vdim, kdim, heads // k.shape[1], PRECISION=precision,
    )  # fmt: skip
