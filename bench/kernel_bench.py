"""Time the checkpoint kernels (GPU), or smoke-run them on CPU under the Triton interpreter.

GPU (``python -m jenga_sglang.bench.kernel_bench``): for Nemotron-H-8B and Qwen3-Next layer shapes,
(1) checkpoint slot-copy bandwidth vs ``torch`` device-to-device copy bandwidth of the same bytes,
measured in one run; (2) roll-forward latency for ``r`` tokens vs a second prefill pass over the
prefix (mamba-ssm's chunked scan, needs mamba-ssm). ``--smoke`` runs tiny shapes on CPU with the
interpreter (the patches come from ``tests/triton_cpu.py``, the one place that holds them).
Prints one JSON object per measurement.
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

# Mamba2 layer shapes (per tensor-parallel rank = 1). Qwen3-Next's linear layers are Gated
# DeltaNet, not Mamba2 SSD: its shapes serve the copy benchmark; the roll-forward does not apply.
SHAPES: dict[str, dict[str, int]] = {
    "nemotron-h-8b": {"heads": 128, "headdim": 64, "dstate": 128, "groups": 8, "conv_k": 4},
    "qwen3-next": {"heads": 32, "headdim": 128, "dstate": 128, "groups": 16, "conv_k": 4},
    "smoke": {"heads": 4, "headdim": 8, "dstate": 16, "groups": 2, "conv_k": 4},
}
MAMBA2_MODELS = ("nemotron-h-8b", "smoke")


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


def conv_dim(s: dict[str, int]) -> int:
    return s["heads"] * s["headdim"] + 2 * s["groups"] * s["dstate"]


def bench_copy(model: str, slots: int, pairs: int, timer: Timer) -> dict[str, Any]:
    """Copy ``pairs`` live-state pages to checkpoint pages: our kernel vs ``torch`` indexing."""
    import torch

    from jenga_sglang.kernels.state_copy import SlotView, copy_slot_pairs

    s = SHAPES[model]
    conv_bytes = conv_dim(s) * (s["conv_k"] - 1) * 2  # bf16
    ssm_bytes = s["heads"] * s["headdim"] * s["dstate"] * 4  # fp32
    page = -(-(conv_bytes + ssm_bytes) // 256) * 256
    buf = torch.zeros(page * slots, dtype=torch.uint8, device=timer.device)
    views = [
        SlotView("conv", 0, page, conv_bytes, slots, itemsize=2),
        SlotView("temporal", conv_bytes, page, ssm_bytes, slots, itemsize=4),
    ]
    jobs = [(i, pairs + i) for i in range(pairs)]
    pages = buf.view(slots, page)
    src = torch.arange(pairs, device=timer.device)
    dst = src + pairs
    moved = pairs * (conv_bytes + ssm_bytes)
    t_kernel = timer(lambda: copy_slot_pairs(buf, views, jobs))
    t_torch = timer(lambda: pages.index_copy_(0, dst, pages[src]))
    return {
        "bench": "checkpoint_copy",
        "model": model,
        "pairs": pairs,
        "bytes": moved,
        "kernel_GBps": moved / t_kernel / 1e9,
        "torch_d2d_GBps": pairs * page / t_torch / 1e9,
        "kernel_s": t_kernel,
        "torch_s": t_torch,
    }


def bench_roll(model: str, batch: int, r: int, prefix: int, timer: Timer) -> dict[str, Any]:
    """Roll ``batch`` requests forward by ``r`` tokens vs rescanning a ``prefix``-token prefill."""
    import torch

    from jenga_sglang.kernels.roll_forward import roll_forward_ssm_states

    s, dev = SHAPES[model], timer.device
    h, p, n, g = s["heads"], s["headdim"], s["dstate"], s["groups"]
    tokens = batch * r
    x = torch.randn(tokens, h, p, device=dev, dtype=torch.bfloat16)
    dt = torch.rand(tokens, h, device=dev) * 0.1
    b = torch.randn(tokens, g, n, device=dev, dtype=torch.bfloat16)
    a = -torch.rand(h, device=dev)
    states = torch.randn(batch, h, p, n, device=dev)
    out = torch.empty_like(states)
    idx = torch.arange(batch, device=dev)
    starts = idx * r
    counts = torch.full((batch,), r, device=dev)
    t_roll = timer(
        lambda: roll_forward_ssm_states(states, idx, out, idx, x, dt, b, a, starts, counts)
    )
    row: dict[str, Any] = {"bench": "roll_forward", "model": model, "batch": batch, "r": r}
    row["roll_s"] = t_roll
    if importlib.util.find_spec("mamba_ssm") is not None:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

        xs = torch.randn(1, prefix, h, p, device=dev, dtype=torch.bfloat16)
        dts = torch.rand(1, prefix, h, device=dev) * 0.1
        bs = torch.randn(1, prefix, g, n, device=dev, dtype=torch.bfloat16)
        row["second_prefill_prefix"] = prefix
        row["second_prefill_s"] = timer(
            lambda: mamba_chunk_scan_combined(xs, dts, a, bs, bs, 256 if dev == "cuda" else 8)
        )
    return row


def _load_interpreter_patches() -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    helper = Path(__file__).resolve().parents[1] / "tests" / "triton_cpu.py"
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
        timer = Timer("cpu", 3)
        plan = [("smoke", 16, 4, 8, 24)]
    else:
        timer = Timer("cuda", args.repeats)
        plan = [(m, 512, 64, 64, 8192) for m in ("nemotron-h-8b", "qwen3-next")]
    for model, slots, pairs, r, prefix in plan:
        print(json.dumps(bench_copy(model, slots, pairs, timer)))
        if model in MAMBA2_MODELS:
            for rr in (1, r // 2, r - 1):
                print(json.dumps(bench_roll(model, 8 if args.smoke else 64, rr, prefix, timer)))


if __name__ == "__main__":
    main()
