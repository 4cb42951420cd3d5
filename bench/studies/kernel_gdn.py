"""Gated DeltaNet in-pass capture, measured (kernel_bench): Qwen3-Next-80B's linear-attention
layer shapes, SGLang's chunked FLA prefill.

A packed prefill of `rows` rows with capture positions spread over them runs through SGLang's
`chunk_gated_delta_rule` (bf16 on a GPU, as SGLang requires; float32 under the CPU interpreter,
with the plugin's CPU patches). Our capture reads the chunk states `h` and delta values `v_new`
that call computed (its `chunk_gated_delta_rule_fwd_h`, recorded). SGLang's own route keeps
states only at chunk boundaries, copied out of `h` (what its `extra_buffer` tracking does for
the Triton kernel): timed for the same number of states, at the chunk boundary before each
capture. Exactness: every capture against a float64 recurrence over its prefix, beside
SGLang's prefill of the prefix alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from jenga_sglang.binding.cache.captures import Capture
from jenga_sglang.binding.capture.geometry import Geometry, plan_gdn

#: Linear-attention layer shapes (tensor-parallel rank 1).
SHAPES: dict[str, dict[str, int]] = {
    "qwen3-next-80b": {
        "d_model": 2048, "v_heads": 32, "k_heads": 16, "kdim": 128, "vdim": 128, "conv_k": 4,
    },
    "smoke": {"d_model": 32, "v_heads": 4, "k_heads": 2, "kdim": 16, "vdim": 16, "conv_k": 4},
}  # fmt: skip
_FLA = "sglang.kernels.ops.attention.fla"


@dataclass(frozen=True)
class Prefill:
    shape: dict[str, int]
    q: Any  # (1, T, Hk, K)
    k: Any
    v: Any  # (1, T, Hv, V)
    g: Any  # (1, T, Hv) log decay, fp32
    beta: Any  # (1, T, Hv)
    xbc: Any  # (T, conv_dim): the conv inputs (q, k, v)
    cu: list[int]
    caps: list[tuple[int, int]]

    def geometry(self, slots: int) -> Geometry:
        lens = [b - a for a, b in zip(self.cu, self.cu[1:], strict=False)]
        caps = tuple(Capture(r, o, i) for i, (r, o) in enumerate(self.caps))
        return plan_gdn(caps, [0] * len(lens), lens, slots)


def make_prefill(
    model: str, rows: int, length: int, captures: int, dtype: Any, dev: str, seed: int = 0
) -> Prefill:
    import torch

    shape = SHAPES[model]
    g = torch.Generator().manual_seed(seed)
    t, hk, hv, kd, vd = (
        rows * length,
        shape["k_heads"],
        shape["v_heads"],
        shape["kdim"],
        shape["vdim"],
    )

    def rand(*size: int) -> Any:
        return torch.randn(*size, generator=g).to(dev)

    offsets = torch.randint(1, length + 1, (captures,), generator=g).tolist()
    return Prefill(
        shape=shape,
        q=rand(1, t, hk, kd).to(dtype),
        k=rand(1, t, hk, kd).to(dtype),
        v=rand(1, t, hv, vd).to(dtype),
        g=torch.nn.functional.logsigmoid(rand(1, t, hv)),
        beta=torch.sigmoid(rand(1, t, hv)).to(dtype),
        xbc=rand(t, 2 * hk * kd + hv * vd).to(dtype),
        cu=[i * length for i in range(rows + 1)],
        caps=sorted({(i % rows, int(o)) for i, o in enumerate(offsets)}),
    )


def _chunk_fn() -> Callable[..., Any]:
    """SGLang's chunked GDN prefill: its float32-accepting CPU wrapper (jenga_sglang/cpu_gdn.py)
    under the interpreter, FLA's own function on a GPU."""
    import torch

    if not torch.cuda.is_available():
        from jenga_sglang import cpu_gdn

        cpu_gdn.install()
        gdn = importlib.import_module("sglang.srt.layers.attention.linear.kernels.gdn_triton")
        return gdn.chunk_gated_delta_rule  # type: ignore[no-any-return]
    return importlib.import_module(f"{_FLA}.chunk").chunk_gated_delta_rule  # type: ignore[no-any-return]


def chunk_forward(pf: Prefill, cu: list[int] | None = None, rows: Any = None) -> Callable[[], Any]:
    """The chunked prefill call over rows `cu` (default: the prefill's), from zero states in a
    pool (returned by the call, final states in slots 1..rows)."""
    import torch

    cu = pf.cu if cu is None else cu
    dev, t = pf.q.device, cu[-1]
    n = len(cu) - 1
    hv, vd, kd = pf.shape["v_heads"], pf.shape["vdim"], pf.shape["kdim"]
    pool = torch.zeros(n + 1, hv, vd, kd, device=dev)
    fn = _chunk_fn()
    cu_t = torch.tensor(cu, dtype=torch.int32, device=dev)
    slots = torch.arange(1, n + 1, device=dev)
    cut = [v[:, :t] if rows is None else v[:, rows] for v in (pf.q, pf.k, pf.v, pf.g, pf.beta)]

    def run() -> Any:
        pool.zero_()
        fn(q=cut[0], k=cut[1], v=cut[2], g=cut[3], beta=cut[4], initial_state=pool,
           initial_state_indices=slots, cu_seqlens=cu_t, head_first=False,
           use_qk_l2norm_in_kernel=True)  # fmt: skip
        return pool

    return run


@contextmanager
def recorded() -> Iterator[dict[str, Any]]:
    """What `chunk_gated_delta_rule_fwd_h` saw and returned during the block (the live hook's
    inputs: binding/capture/gdn.py)."""
    chunk = importlib.import_module(f"{_FLA}.chunk")
    name = "chunk_gated_delta_rule_fwd_h"  # looked up in chunk.py's namespace per call
    original = getattr(chunk, name)
    seen: dict[str, Any] = {}

    def wrapped(**kw: Any) -> Any:
        h, v_new = original(**kw)
        seen.update(kw, h=h, v_new=v_new)
        return h, v_new

    setattr(chunk, name, wrapped)
    try:
        yield seen
    finally:
        setattr(chunk, name, original)


def layer_forward(pf: Prefill) -> Callable[[], None]:
    """The linear-attention layer's prefill: in projections (q k v z, then b a), the depthwise
    causal conv over q k v, the chunked kernel, the out projection."""
    import torch

    s = pf.shape
    t, d = pf.q.shape[1], s["d_model"]
    key, val = s["k_heads"] * s["kdim"], s["v_heads"] * s["vdim"]
    dtype = torch.bfloat16 if pf.q.is_cuda else torch.float32
    dev = pf.q.device
    hidden = torch.randn(t, d, device=dev, dtype=dtype)
    w_qkvz = torch.randn(2 * key + 2 * val, d, device=dev, dtype=dtype)
    w_ba = torch.randn(2 * s["v_heads"], d, device=dev, dtype=dtype)
    w_out = torch.randn(d, val, device=dev, dtype=dtype)
    w_conv = torch.randn(pf.xbc.shape[1], 1, s["conv_k"], device=dev, dtype=pf.xbc.dtype)
    chunk = chunk_forward(pf)

    def run() -> None:
        hidden @ w_qkvz.T
        hidden @ w_ba.T
        torch.nn.functional.conv1d(
            pf.xbc.T[None], w_conv, padding=s["conv_k"] - 1, groups=pf.xbc.shape[1]
        )
        chunk()
        pf.v[0].reshape(t, val).to(dtype) @ w_out.T

    return run


@dataclass
class Launches:
    conv: Callable[[], None]
    capture: Callable[[], None]
    sglang_copy: Callable[[], None]  # SGLang's route: chunk-boundary states copied out of h
    out: Any


def our_launches(pf: Prefill, seen: dict[str, Any], precision: str = "tf32x3") -> Launches:
    import torch

    from jenga_sglang.kernels.conv_gather import gather_conv_states
    from jenga_sglang.kernels.gdn_capture import GdnCaptures, capture_gdn_states

    n, dev = len(pf.caps), pf.q.device
    geo = pf.geometry(n)
    h, v_new, k, g = seen["h"][0], seen["v_new"][0], seen["k"][0], seen["g"][0]
    out = torch.zeros(n, *h.shape[1:], device=dev)
    copied = torch.zeros_like(out)
    conv_out = torch.zeros(n, pf.xbc.shape[1], pf.shape["conv_k"] - 1, device=dev)

    def ids(v: tuple[int, ...]) -> Any:
        return torch.tensor(v, dtype=torch.int64, device=dev)

    conv_ix = [ids(v) for v in (geo.dst, geo.conv_start, geo.conv_count)]
    caps = GdnCaptures(*(ids(v) for v in (geo.chunk_src, geo.dst, geo.ssm_start, geo.ssm_count)))
    src, dst = ids(geo.chunk_src), ids(geo.dst)

    def copy() -> None:
        copied[dst] = h[src].to(copied.dtype)

    return Launches(
        conv=lambda: gather_conv_states(pf.xbc, conv_out, *conv_ix, checked=True),
        capture=lambda: capture_gdn_states(
            h, out, k, v_new, g, caps, checked=True, precision=precision
        ),
        sglang_copy=copy,
        out=out,
    )


def sglang_prefix_states(pf: Prefill) -> Any:
    """SGLang's chunked prefill of each capture's prefix alone (packed as rows): final states."""
    import torch

    dev = pf.q.device
    parts = [(pf.cu[r], pf.cu[r] + o) for r, o in pf.caps]
    rows = torch.cat([torch.arange(a, b, device=dev) for a, b in parts])
    cu = [0]
    for a, b in parts:
        cu.append(cu[-1] + b - a)
    return chunk_forward(pf, cu, rows)()[1:].float()


def truth_states(pf: Prefill) -> Any:
    """Float64 recurrence per row (SGLang's convention: S = exp(g) S; S += beta (v - S k) k^T,
    q and k l2-normalised), the state after each capture's prefix."""
    import torch

    f64 = torch.float64
    rep = pf.shape["v_heads"] // pf.shape["k_heads"]
    k = pf.k[0].to(f64)
    k = (k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(rep, 1)
    v, g, beta = (t[0].to(f64) for t in (pf.v, pf.g, pf.beta))
    out: list[Any] = [None] * len(pf.caps)
    want: dict[int, int] = {pf.cu[r] + o: i for i, (r, o) in enumerate(pf.caps)}
    for row in range(len(pf.cu) - 1):
        s = torch.zeros(v.shape[1], v.shape[2], k.shape[2], dtype=f64, device=v.device)
        for t in range(pf.cu[row], pf.cu[row + 1]):
            s = s * torch.exp(g[t])[:, None, None]
            delta = beta[t][:, None] * (v[t] - torch.einsum("hvk,hk->hv", s, k[t]))
            s = s + torch.einsum("hv,hk->hvk", delta, k[t])
            if t + 1 in want:
                out[want[t + 1]] = s.clone()
    return torch.stack(out)
