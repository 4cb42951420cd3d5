"""What in-pass capture costs a Mamba2 prefill (GPU), or a smoke run on CPU (Triton interpreter).

For Nemotron-H-8B layer shapes, a packed prefill of ``rows`` requests (8k tokens in all) with
``captures`` checkpoint positions at random offsets, it times in one run:

* the layer's prefill forward: the in/out projections (GEMMs), the depthwise causal conv and the
  chunked SSD scan (SGLang's vendored scan when SGLang is importable, else mamba-ssm's);
* our capture (binding/capture_forward.py's launches): the conv gather plus the roll-forward
  from the scan's chunk-boundary states (kernels/conv_gather.py, kernels/roll_forward.py);
* where SGLang is importable, its tracked-state route for the same positions
  (``chunk_state_varlen`` over (row start, position) segments, one call per capture rank, as
  ``mamba_chunk_scan_combined(..., track_end_locs=...)`` does for one position per row),

and the largest SSM-state difference between the two routes. ``--smoke`` runs tiny shapes on
CPU with the interpreter (patches from ``tests/triton_cpu.py``): it proves the script runs and
gives the exactness figure; interpreter timings measure Python, not kernels. One JSON object
per measurement.

    python -m jenga_sglang.bench.studies.kernel_bench [--smoke] [--repeats N]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Mamba2 layer shapes (tensor-parallel rank 1).
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


@dataclass(frozen=True)
class Timer:
    """Median wall time of ``fn`` in seconds (synchronising the GPU around each call)."""

    device: str
    repeats: int

    def __call__(self, fn: Callable[[], Any]) -> float:
        import torch

        fn()  # warm-up (compilation)
        times = []
        for _ in range(self.repeats):
            if self.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if self.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2]


@dataclass(frozen=True)
class Prefill:
    """One packed prefill's tensors and its capture positions (flat packed token indices)."""

    x: Any  # (T, H, P)
    dt: Any  # (T, H) raw
    b: Any  # (T, G, N)
    c: Any
    a: Any  # (H,)
    dt_bias: Any  # (H,)
    xbc: Any  # (T, conv_dim) conv inputs
    cu: list[int]  # row starts, then T
    caps: list[tuple[int, int]]  # (row, offset >= 1)


def make_prefill(shape: dict[str, int], rows: int, length: int, captures: int, dev: str) -> Prefill:
    import torch

    g = torch.Generator().manual_seed(0)
    h, p, n, grp = shape["heads"], shape["headdim"], shape["dstate"], shape["groups"]
    t = rows * length

    def rand(*size: int) -> Any:
        return torch.randn(*size, generator=g).to(dev)

    offsets = torch.randint(1, length + 1, (captures,), generator=g).tolist()
    caps = sorted({(i % rows, int(o)) for i, o in enumerate(offsets)})
    return Prefill(
        x=rand(t, h, p),
        dt=rand(t, h) * 0.5,
        b=rand(t, grp, n),
        c=rand(t, grp, n),
        a=-torch.rand(h, generator=g).to(dev),
        dt_bias=rand(h) * 0.1,
        xbc=rand(t, h * p + 2 * grp * n),
        cu=[i * length for i in range(rows + 1)],
        caps=caps,
    )


def sglang_scan() -> Callable[..., Any] | None:
    if importlib.util.find_spec("sglang") is None:
        return None
    from sglang.kernels.ops.mamba.triton_ops.ssd_combined import _mamba_chunk_scan_combined_fwd

    return _mamba_chunk_scan_combined_fwd  # type: ignore[no-any-return]


def scan(pf: Prefill, chunk: int) -> Any:
    """The chunked scan of the packed rows; returns its processed dt, dA cumsum (H, nchunks,
    chunk) and chunk-boundary states (nchunks, H, P, N)."""
    import torch

    fn = sglang_scan()
    cu = torch.tensor(pf.cu, dtype=torch.int32, device=pf.x.device)
    seq_idx = torch.repeat_interleave(
        torch.arange(len(pf.cu) - 1, dtype=torch.int32, device=pf.x.device), cu.diff()
    )[None]
    args = (pf.x[None], pf.dt[None], pf.a, pf.b[None], pf.c[None], chunk)
    kw = dict(dt_bias=pf.dt_bias, dt_softplus=True, seq_idx=seq_idx, cu_seqlens=cu)
    if fn is None:
        raise RuntimeError("kernel_bench needs SGLang's Mamba Triton ops (docs/kernels.md)")
    out = torch.empty_like(pf.x[None])
    res = fn(*args, **kw, out=out)
    return res[1][0], res[2][0], res[3][0]


def capture_ours(pf: Prefill, chunk: int, scan_out: Any, ssm_out: Any, conv_out: Any) -> Any:
    """Our launches for every capture (geometry as binding/capture_geometry.py plans it)."""
    import torch

    from jenga_sglang.binding.capture_geometry import plan_geometry
    from jenga_sglang.binding.captures import Capture
    from jenga_sglang.kernels.conv_gather import gather_conv_states
    from jenga_sglang.kernels.ssd_capture import SsdCaptures, capture_ssd_states

    dt, cumsum, states = scan_out
    lens = [b - a for a, b in zip(pf.cu, pf.cu[1:], strict=False)]
    caps = tuple(Capture(r, o, i) for i, (r, o) in enumerate(pf.caps))
    geo = plan_geometry(caps, [0] * len(lens), lens, chunk, ssm_out.shape[0])
    dev = pf.x.device

    def ids(v: tuple[int, ...]) -> Any:
        return torch.tensor(v, dtype=torch.int64, device=dev)

    conv = [ids(v) for v in (geo.dst, geo.conv_start, geo.conv_count)]
    ssm = SsdCaptures(
        *(ids(v) for v in (geo.chunk_src, geo.row_src, geo.dst, geo.ssm_start, geo.ssm_count))
    )

    def run() -> None:
        gather_conv_states(pf.xbc, conv_out, *conv, checked=True)
        capture_ssd_states(states, None, ssm_out, pf.x, pf.b, dt, cumsum, ssm, checked=True)

    return run


def capture_sglang(pf: Prefill, chunk: int, states: Any, out: Any) -> Callable[[], None] | None:
    """SGLang's tracked-state route: chunk_state_varlen over (row start, position) segments;
    a row appears once per call, so captures are issued in ranks (k-th capture of each row)."""
    if sglang_scan() is None:
        return None
    import torch
    from sglang.kernels.ops.mamba.triton_ops.ssd_chunk_state import (
        _chunk_cumsum_fwd,
        chunk_state_varlen,
    )

    ranks: list[list[int]] = []
    seen: dict[int, int] = {}
    for i, (row, _) in enumerate(pf.caps):
        k = seen.get(row, 0)
        seen[row] = k + 1
        if k == len(ranks):
            ranks.append([])
        ranks[k].append(i)
    dev = pf.x.device

    def run() -> None:
        da, dt = _chunk_cumsum_fwd(pf.dt[None], pf.a, chunk, dt_bias=pf.dt_bias, dt_softplus=True)
        for rank in ranks:
            bounds = [
                v
                for i in rank
                for v in (pf.cu[pf.caps[i][0]], pf.cu[pf.caps[i][0]] + pf.caps[i][1])
            ]
            got = chunk_state_varlen(
                pf.b,
                pf.x,
                dt[0],
                da[0],
                torch.tensor(bounds, dtype=torch.int32, device=dev),
                states,
            )[::2]
            out[torch.tensor(rank, device=dev)] = got.to(out.dtype)

    return run


def layer_forward(pf: Prefill, shape: dict[str, int], chunk: int) -> Callable[[], None]:
    """The Mamba2 layer's prefill: projections, depthwise causal conv, chunked scan."""
    import torch

    t, d = pf.x.shape[0], shape["d_model"]
    inner = shape["heads"] * shape["headdim"]
    proj = 2 * inner + 2 * shape["groups"] * shape["dstate"] + shape["heads"]
    dtype = torch.bfloat16 if pf.x.is_cuda else torch.float32
    hidden = torch.randn(t, d, device=pf.x.device, dtype=dtype)
    w_in = torch.randn(proj, d, device=pf.x.device, dtype=dtype)
    w_out = torch.randn(d, inner, device=pf.x.device, dtype=dtype)
    w_conv = torch.randn(pf.xbc.shape[1], 1, shape["conv_k"], device=pf.x.device)

    def run() -> None:
        hidden @ w_in.T
        torch.nn.functional.conv1d(
            pf.xbc.T[None], w_conv, padding=shape["conv_k"] - 1, groups=pf.xbc.shape[1]
        )
        scan(pf, chunk)
        pf.x.reshape(t, inner).to(dtype) @ w_out.T

    return run


def bench_capture(
    model: str, rows: int, length: int, captures: int, timer: Timer
) -> dict[str, Any]:
    import torch

    shape, chunk = SHAPES[model], SHAPES[model]["chunk"]
    pf = make_prefill(shape, rows, length, captures, timer.device)
    scan_out = scan(pf, chunk)
    states = scan_out[2]
    n = len(pf.caps)
    ours_out = torch.zeros(n, *states.shape[1:], device=timer.device)
    conv_out = torch.zeros(n, pf.xbc.shape[1], shape["conv_k"] - 1, device=timer.device)
    ours = capture_ours(pf, chunk, scan_out, ours_out, conv_out)
    row: dict[str, Any] = {"bench": "capture", "model": model, "tokens": rows * length}
    row |= {"captures": n, "device": timer.device}
    row["layer_forward_s"] = timer(layer_forward(pf, shape, chunk))
    row["capture_s"] = timer(ours)
    row["capture_share"] = row["capture_s"] / row["layer_forward_s"]
    theirs_out = torch.zeros_like(ours_out)
    theirs = capture_sglang(pf, chunk, states, theirs_out)
    if theirs is not None:
        row["sglang_track_s"] = timer(theirs)
        row["routes_max_abs_diff"] = float((ours_out - theirs_out).abs().max())
    return row


def _load_interpreter_patches() -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    helper = Path(__file__).resolve().parents[2] / "tests" / "triton_cpu.py"
    spec = importlib.util.spec_from_file_location("triton_cpu", helper)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load the interpreter helper {helper}")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (interpreter)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    if args.smoke:
        _load_interpreter_patches()
        print(json.dumps(bench_capture("smoke", 4, 40, 8, Timer("cpu", 3))))
        return
    timer = Timer("cuda", args.repeats)
    print(json.dumps(bench_capture("nemotron-h-8b", 8, 1024, 16, timer)))


if __name__ == "__main__":
    main()
