"""Gather the causal-conv1d state of a batch of requests at exact positions.

The conv state at position ``p`` is the last ``K - 1`` conv *inputs* before ``p`` (``K`` = conv
width), oldest first: exactly what causal-conv1d returns as its final state for the prefix
``[0, p)``. Request ``i``'s prefill covers packed tokens ``[tok_start[i], tok_start[i] + n_tok[i])``
and its state is wanted after those ``n_tok[i]`` tokens. Inputs older than this prefill come from
the request's initial conv state (slot ``init_idx[i]``), or are zeros when it has none (a request
that starts at token 0, or ``p < K - 1``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from jenga_sglang.kernels.checks import (
    check_float,
    check_range,
    check_same_device,
    check_unique,
    index_list,
    require,
)

if TYPE_CHECKING:
    import torch

NO_INIT = -1
"""``init_idx`` value meaning "no earlier inputs": positions before the prefill read as zero."""


@triton.jit  # type: ignore[untyped-decorator]
def _conv_gather_kernel(  # type: ignore[no-untyped-def]
    xbc,
    init,
    init_idx,
    out,
    dst_idx,
    tok_start,
    n_tok,
    s_x_t,
    s_x_d,
    s_i_slot,
    s_i_d,
    s_i_k,
    s_o_slot,
    s_o_d,
    s_o_k,
    dim,
    KM1: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    req = tl.program_id(0)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < dim
    start = tl.load(tok_start + req).to(tl.int64)
    count = tl.load(n_tok + req).to(tl.int64)
    src = tl.load(init_idx + req).to(tl.int64)
    dst = tl.load(dst_idx + req).to(tl.int64)
    for j in tl.static_range(KM1):
        # Window entry j holds the input at local position count - KM1 + j.
        t = count - KM1 + j
        in_prefill = t >= 0
        from_x = tl.load(
            xbc + (start + tl.maximum(t, 0)) * s_x_t + offs_d * s_x_d,
            mask=mask_d & in_prefill,
            other=0.0,
        )
        # t < 0: entry KM1 + t of the initial state (t >= -KM1 always holds).
        k_old = tl.maximum(KM1 + t, 0)
        from_init = tl.load(
            init + tl.maximum(src, 0) * s_i_slot + offs_d * s_i_d + k_old * s_i_k,
            mask=mask_d & (t < 0) & (src >= 0),
            other=0.0,
        )
        val = tl.where(in_prefill, from_x.to(tl.float32), from_init.to(tl.float32))
        tl.store(
            out + dst * s_o_slot + offs_d * s_o_d + j * s_o_k,
            val.to(out.dtype.element_ty),
            mask=mask_d,
        )


def check_conv_requests(
    dst: list[int], starts: list[int], counts: list[int], out_slots: int, tokens: int
) -> None:
    """Host-side checks of one launch's destinations and token ranges. A caller that builds the
    indices on the host checks them here once and then launches with ``checked=True``."""
    n = len(dst)
    for name, values in (("tok_start", starts), ("n_tok", counts)):
        require(len(values) == n, f"{name}: expected {n} entries, got {len(values)}")
    check_range("dst_idx", dst, 0, out_slots)
    check_unique("dst_idx", dst)
    for i, (s, c) in enumerate(zip(starts, counts, strict=True)):
        require(
            c >= 0 and s >= 0 and s + c <= tokens,
            f"request {i}: tokens [{s}, {s + c}) not in [0, {tokens})",
        )


def gather_conv_states(
    xbc: torch.Tensor,
    out: torch.Tensor,
    dst_idx: torch.Tensor,
    tok_start: torch.Tensor,
    n_tok: torch.Tensor,
    init: torch.Tensor | None = None,
    init_idx: torch.Tensor | None = None,
    *,
    checked: bool = False,
) -> None:
    """Write each request's conv state after ``n_tok[i]`` of its prefill tokens into ``out``.

    ``xbc``: (T, D) packed conv inputs (any strides, float). ``out``: (slots, D, K - 1) with
    ``K - 1 >= 1``; ``dst_idx[i]`` (distinct) picks the slot. ``init``: (slots', D, K - 1) initial
    conv states, ``init_idx[i]`` a slot or ``NO_INIT``; both ``None`` means no request has one.
    Raises ``ValueError`` before launching. Unchecked, ``out`` must not share storage with
    ``init`` (a destination could be another request's initial state). ``checked=True``: the
    caller validated the indices with ``check_conv_requests`` and guarantees that no
    destination slot is an ``init_idx`` slot, so ``init`` may be ``out`` itself (the live pool).
    """
    require(xbc.dim() == 2, f"xbc: expected (tokens, dim), got shape {tuple(xbc.shape)}")
    tokens, dim = xbc.shape
    require(
        out.dim() == 3 and out.shape[1] == dim and out.shape[2] >= 1,
        f"out: expected (slots, {dim}, K-1 >= 1), got shape {tuple(out.shape)}",
    )
    km1 = out.shape[2]
    n = dst_idx.numel()
    if not checked:
        names = ("dst_idx", "tok_start", "n_tok")
        dst, starts, counts = (
            index_list(k, t, n) for k, t in zip(names, (dst_idx, tok_start, n_tok), strict=True)
        )
        check_conv_requests(dst, starts, counts, out.shape[0], tokens)
    tensors = {"xbc": xbc, "out": out}
    if init is None:
        require(init_idx is None, "init_idx given without init")
        init_t, idx_t = out, dst_idx.new_full((n,), NO_INIT)
    else:
        require(init_idx is not None, "init given without init_idx")
        assert init_idx is not None
        require(
            init.dim() == 3 and tuple(init.shape[1:]) == (dim, km1),
            f"init: expected (slots, {dim}, {km1}), got shape {tuple(init.shape)}",
        )
        if not checked:
            require(
                init.untyped_storage().data_ptr() != out.untyped_storage().data_ptr(),
                "init and out share storage: gather into a separate tensor, then copy",
            )
            check_range(
                "init_idx",
                index_list("init_idx", init_idx, n),
                0,
                init.shape[0],
                allow=(NO_INIT,),
            )
        init_t, idx_t = init, init_idx
        tensors["init"] = init
    for name, t in tensors.items():
        check_float(name, t)
    check_same_device(tensors)
    if n == 0:
        return
    block_d = min(triton.next_power_of_2(dim), 1024)
    grid = (n, triton.cdiv(dim, block_d))
    _conv_gather_kernel[grid](
        xbc,
        init_t,
        idx_t,
        out,
        dst_idx,
        tok_start,
        n_tok,
        *xbc.stride(),
        *init_t.stride(),
        *out.stride(),
        dim,
        KM1=km1,
        BLOCK_D=block_d,
    )
