"""Mamba2 in-pass capture, measured (kernel_bench): Nemotron-H-8B layer shapes, SGLang's scan.

A packed prefill of `rows` rows of `length` tokens with capture positions spread over the rows
(random offsets, seeded). What the live path runs per Mamba layer is timed against the layer's
prefill forward; SGLang's own route, tracking one position per row inside its scan call
(`mamba_chunk_scan_combined(..., track_seq_idx=, track_end_locs=)`, as its mixer calls it), is
timed as the difference it makes to the scan. Exactness compares every captured state with a
float64 closed form of the recurrence over the row's prefix, beside SGLang's tracked route and
SGLang's scan of the prefix alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jenga_sglang.binding.cache.captures import Capture
from jenga_sglang.binding.capture.geometry import Geometry, plan_mamba2

#: Mamba2 layer shapes (tensor-parallel rank 1).
SHAPES: dict[str, dict[str, int]] = {
    "nemotron-h-8b": {
        "d_model": 4096, "heads": 128, "headdim": 64, "dstate": 128, "groups": 8,
        "conv_k": 4, "chunk": 128,
    },
    "smoke": {
        "d_model": 32, "heads": 4, "headdim": 8, "dstate": 16, "groups": 2, "conv_k": 4,
        "chunk": 16,
    },
}  # fmt: skip
DT_LIMIT = (0.0, float("inf"))


@dataclass(frozen=True)
class Prefill:
    """One packed prefill's scan inputs and capture positions."""

    shape: dict[str, int]
    x: Any  # (T, H, P), activation dtype
    dt: Any  # (T, H) raw
    b: Any  # (T, G, N)
    c: Any
    a: Any  # (H,) fp32
    dt_bias: Any  # (H,) fp32
    xbc: Any  # (T, conv_dim) conv inputs
    cu: list[int]  # row starts, then T
    caps: list[tuple[int, int]]  # (row, offset >= 1), distinct

    @property
    def chunk(self) -> int:
        return self.shape["chunk"]

    def flat(self, i: int) -> int:
        row, offset = self.caps[i]
        return self.cu[row] + offset

    def geometry(self, slots: int) -> Geometry:
        lens = [b - a for a, b in zip(self.cu, self.cu[1:], strict=False)]
        caps = tuple(Capture(r, o, i) for i, (r, o) in enumerate(self.caps))
        return plan_mamba2(caps, [0] * len(lens), lens, self.chunk, slots)


def make_prefill(
    model: str, rows: int, length: int, captures: int, dtype: Any, dev: str, seed: int = 0
) -> Prefill:
    """Capture i lies in row i % rows at a random offset (duplicates dropped); with
    `captures == rows` every row has one (SGLang's route takes one per row)."""
    import torch

    shape = SHAPES[model]
    g = torch.Generator().manual_seed(seed)
    h, p, n, grp = shape["heads"], shape["headdim"], shape["dstate"], shape["groups"]
    t = rows * length

    def rand(*size: int, scale: float = 1.0) -> Any:
        return (torch.randn(*size, generator=g) * scale).to(dev)

    offsets = torch.randint(1, length + 1, (captures,), generator=g).tolist()
    caps = sorted({(i % rows, int(o)) for i, o in enumerate(offsets)})
    return Prefill(
        shape=shape,
        x=rand(t, h, p).to(dtype),
        dt=rand(t, h, scale=0.5).to(dtype),
        b=rand(t, grp, n).to(dtype),
        c=rand(t, grp, n).to(dtype),
        a=-torch.rand(h, generator=g).to(dev),
        dt_bias=rand(h, scale=0.1),
        xbc=rand(t, h * p + 2 * grp * n).to(dtype),
        cu=[i * length for i in range(rows + 1)],
        caps=caps,
    )


def _sglang_scan() -> tuple[Callable[..., Any], Callable[..., Any]]:
    from sglang.kernels.ops.mamba.triton_ops.ssd_combined import (
        _mamba_chunk_scan_combined_fwd,
        mamba_chunk_scan_combined,
    )

    return mamba_chunk_scan_combined, _mamba_chunk_scan_combined_fwd


def _scan_args(pf: Prefill, cu: list[int] | None = None) -> tuple[tuple[Any, ...], dict[str, Any]]:
    import torch

    cu = pf.cu if cu is None else cu
    dev = pf.x.device
    cu_t = torch.tensor(cu, dtype=torch.int32, device=dev)
    seq_idx = torch.repeat_interleave(
        torch.arange(len(cu) - 1, dtype=torch.int32, device=dev), cu_t.diff()
    )[None]
    t = cu[-1]
    args = (pf.x[None, :t], pf.dt[None, :t], pf.a, pf.b[None, :t], pf.c[None, :t], pf.chunk)
    # fp32 chunk states, as the mixer asks for its fp32 state pool (`state_dtype`)
    kw = {"dt_bias": pf.dt_bias, "dt_softplus": True, "dt_limit": DT_LIMIT, "seq_idx": seq_idx,
          "cu_seqlens": cu_t, "state_dtype": torch.float32}  # fmt: skip
    return args, kw


def mixer_scan(pf: Prefill, track: list[int] | None = None) -> Callable[[], Any]:
    """The scan as SGLang's mixer calls it (varlen, chunk states returned), tracking one flat
    position per row (`track[i]` for row i) when given; returns the call."""
    import torch

    scan, _ = _sglang_scan()
    args, kw = _scan_args(pf)
    out = torch.empty_like(pf.x[None])
    if track is not None:
        kw["track_seq_idx"] = torch.arange(len(track), device=pf.x.device)
        kw["track_end_locs"] = torch.tensor(track, device=pf.x.device)

    def run() -> Any:
        return scan(*args, **kw, out=out, return_varlen_states=True, return_track_states=True)

    return run


def scan_outputs(pf: Prefill) -> tuple[Any, Any, Any]:
    """The scan's processed dt, dA cumsum (H, C, L) and chunk states (C, H, P, N): what the
    live hook reads off `_mamba_chunk_scan_combined_fwd`."""
    import torch

    _, fwd = _sglang_scan()
    args, kw = _scan_args(pf)
    res = fwd(*args, **kw, out=torch.empty_like(pf.x[None]))
    return res[1][0], res[2][0], res[3][0]


def layer_forward(pf: Prefill) -> Callable[[], None]:
    """The Mamba2 layer's prefill: in/out projections (bf16 GEMMs on a GPU), the depthwise
    causal conv and the scan as the mixer calls it."""
    import torch

    shape = pf.shape
    t, d = pf.x.shape[0], shape["d_model"]
    inner = shape["heads"] * shape["headdim"]
    proj = 2 * inner + 2 * shape["groups"] * shape["dstate"] + shape["heads"]
    dtype = torch.bfloat16 if pf.x.is_cuda else torch.float32
    dev = pf.x.device
    hidden = torch.randn(t, d, device=dev, dtype=dtype)
    w_in = torch.randn(proj, d, device=dev, dtype=dtype)
    w_out = torch.randn(d, inner, device=dev, dtype=dtype)
    w_conv = torch.randn(pf.xbc.shape[1], 1, shape["conv_k"], device=dev, dtype=pf.xbc.dtype)
    scan = mixer_scan(pf)

    def run() -> None:
        hidden @ w_in.T
        torch.nn.functional.conv1d(
            pf.xbc.T[None], w_conv, padding=shape["conv_k"] - 1, groups=pf.xbc.shape[1]
        )
        scan()
        pf.x.reshape(t, inner).to(dtype) @ w_out.T

    return run


@dataclass
class Launches:
    """Our per-layer launches for a prefill's captures, as the live hooks make them."""

    conv: Callable[[], None]
    ssd: Callable[[], None]
    sequential: Callable[[], None]  # the earlier roll-forward route, for comparison
    ssm_out: Any


def our_launches(
    pf: Prefill, scan_out: tuple[Any, Any, Any], precision: str = "tf32x3"
) -> Launches:
    import torch

    from jenga_sglang.kernels.conv_gather import gather_conv_states
    from jenga_sglang.kernels.roll_forward import NO_SOURCE, DtProcessing, roll_forward_ssm_states
    from jenga_sglang.kernels.ssd_capture import NO_STATE, SsdCaptures, capture_ssd_states

    dt, cumsum, states = scan_out
    n, dev = len(pf.caps), pf.x.device
    geo = pf.geometry(n)
    ssm_out = torch.zeros(n, *states.shape[1:], device=dev)
    seq_out = torch.zeros_like(ssm_out)
    conv_out = torch.zeros(n, pf.xbc.shape[1], pf.shape["conv_k"] - 1, device=dev)

    def ids(v: tuple[int, ...] | list[int]) -> Any:
        return torch.tensor(v, dtype=torch.int64, device=dev)

    conv_ix = [ids(v) for v in (geo.dst, geo.conv_start, geo.conv_count)]
    ssd = SsdCaptures.of(geo.chunk_src, geo.row_src, geo.ssm_start, geo.ssm_count,
                         geo.ssm_chains, ids(geo.dst))  # fmt: skip
    seq_src = [k if k != NO_STATE else NO_SOURCE for k in geo.chunk_src]
    src, dst, start, count = (ids(v) for v in (seq_src, geo.dst, geo.ssm_start, geo.ssm_count))
    proc = DtProcessing(pf.dt_bias, True, *DT_LIMIT)

    def sequential() -> None:
        roll_forward_ssm_states(
            states, src, seq_out, dst, pf.x, pf.dt, pf.b, pf.a, start, count, proc, checked=True
        )

    return Launches(
        conv=lambda: gather_conv_states(pf.xbc, conv_out, *conv_ix, checked=True),
        ssd=lambda: capture_ssd_states(
            states, None, ssm_out, pf.x, pf.b, dt, cumsum, ssd, checked=True, precision=precision
        ),
        sequential=sequential,
        ssm_out=ssm_out,
    )


def sglang_tracked_states(pf: Prefill) -> Any:
    """SGLang's in-scan route for every capture: one scan call per rank (the k-th capture of
    each row), each tracking one position per row; (captures, H, P, N)."""
    import torch

    ranks: dict[int, list[int]] = {}
    seen: dict[int, int] = {}
    for i, (row, _) in enumerate(pf.caps):
        k = seen.get(row, 0)
        seen[row] = k + 1
        ranks.setdefault(k, []).append(i)
    out: list[Any] = [None] * len(pf.caps)
    scan, _ = _sglang_scan()
    args, kw = _scan_args(pf)
    for members in ranks.values():
        kw["track_seq_idx"] = torch.tensor([pf.caps[i][0] for i in members], device=pf.x.device)
        kw["track_end_locs"] = torch.tensor([pf.flat(i) for i in members], device=pf.x.device)
        _, _, tracked = scan(*args, **kw, out=torch.empty_like(pf.x[None]),
                             return_varlen_states=True, return_track_states=True)  # fmt: skip
        for j, i in enumerate(members):
            out[i] = tracked[0, j].float()
    return torch.stack(out)


def sglang_prefix_states(pf: Prefill) -> Any:
    """SGLang's scan of each capture's prefix alone (the prefixes packed as rows); their final
    (varlen) states, (captures, H, P, N)."""
    import torch

    scan, _ = _sglang_scan()
    parts = [(pf.cu[r], pf.cu[r] + o) for r, o in pf.caps]
    picks = torch.cat([torch.arange(a, b, device=pf.x.device) for a, b in parts])
    cu = [0]
    for a, b in parts:
        cu.append(cu[-1] + b - a)
    alone = Prefill(
        pf.shape, pf.x[picks], pf.dt[picks], pf.b[picks], pf.c[picks], pf.a, pf.dt_bias,
        pf.xbc, cu, [],
    )  # fmt: skip
    args, kw = _scan_args(alone)
    out = torch.empty_like(alone.x[None])
    return scan(*args, **kw, out=out, return_varlen_states=True).float()


def truth_states(pf: Prefill, block: int = 256) -> Any:
    """Float64 closed form of the recurrence over each capture's prefix: per row, blocks of
    `block` tokens, h_q = exp(cs_q) h_start + sum_t exp(cs_q - cs_t) dt_t x_t (outer) B_t."""
    import torch

    f64 = torch.float64
    heads, groups = pf.shape["heads"], pf.shape["groups"]
    x, bmat = pf.x.to(f64), pf.b.to(f64).repeat_interleave(heads // groups, dim=1)
    dt = torch.nn.functional.softplus(pf.dt.to(f64) + pf.dt_bias.to(f64)).clamp(*DT_LIMIT)
    da = dt * pf.a.to(f64)
    out: list[Any] = [None] * len(pf.caps)
    by_row: dict[int, list[int]] = {}
    for i, (row, _) in enumerate(pf.caps):
        by_row.setdefault(row, []).append(i)
    for row, members in by_row.items():
        h = torch.zeros(x.shape[1], x.shape[2], bmat.shape[2], dtype=f64, device=x.device)
        start, end = pf.cu[row], pf.cu[row + 1]
        for lo in range(start, end, block):
            hi = min(lo + block, end)
            cs = da[lo:hi].cumsum(0)  # (L, H)
            for i in members:
                q = pf.flat(i) - lo  # tokens of this block before the capture
                if 0 < q <= hi - lo:
                    out[i] = _advance(h, cs[:q], dt[lo : lo + q], x[lo : lo + q], bmat[lo : lo + q])
            h = _advance(h, cs, dt[lo:hi], x[lo:hi], bmat[lo:hi])
    return torch.stack(out)


def _advance(h: Any, cs: Any, dt: Any, x: Any, b: Any) -> Any:
    import torch

    w = torch.exp(cs[-1] - cs) * dt  # (L, H)
    return torch.exp(cs[-1])[:, None, None] * h + torch.einsum("th,thp,thn->hpn", w, x, b)
