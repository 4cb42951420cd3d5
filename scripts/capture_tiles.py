"""Sweep the capture kernels' launch configurations on a GPU (no SGLang needed beyond .gpu/).

kernels/ssd_capture.py and kernels/gdn_capture.py autotune among two tiles each. This times
every configuration of a wider grid (tile sizes, warps, pipeline stages) and each dot precision
at kernel_bench's packings, one configuration at a time, so a change of TILES or of the default
precision rests on measurements. One JSON object per (kind, packing, config) on stdout, the best
per packing on stderr.

    scripts/sglang-gpu-ops.sh .gpu                                  # where SGLang is installed
    PYTHONPATH=.:.gpu python scripts/capture_tiles.py [--kinds mamba2,gdn]   # on the GPU
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import triton
from triton.testing import do_bench

from jenga_sglang.bench.studies import kernel_bench as kb
from jenga_sglang.bench.studies import kernel_gdn as gd
from jenga_sglang.bench.studies import kernel_mamba2 as m2
from jenga_sglang.kernels import gdn_capture, ssd_capture
from jenga_sglang.kernels.ssd_capture import PRECISIONS  # the GDN capture takes the same

PACKINGS = ((8, 1024, 16), (8, 1024, 127), (64, 128, 64))
TILE_NAMES = {"mamba2": ("BLOCK_M", "BLOCK_N", "BLOCK_K"), "gdn": ("BLOCK_V", "BLOCK_K", "BLOCK_T")}


def grid(names: tuple[str, str, str]) -> Iterator[triton.Config]:
    """(rows, cols, tokens) tiles x warps x stages; the default tiles are among them."""
    rows, cols, toks = names
    for m, n, k, warps, stages in itertools.product(
        (32, 64), (64, 128), (16, 32, 64), (4, 8), (2, 3)
    ):
        yield triton.Config({rows: m, cols: n, toks: k}, num_warps=warps, num_stages=stages)


def sweep(
    kind: str,
    kernel: Any,
    launcher: Callable[..., None],
    launch: Callable[[], None],
    head: dict[str, Any],
) -> Iterator[dict[str, Any]]:
    """Every config at the default precision, then every precision at the best config."""
    tiles = list(kernel.configs)
    names = (
        ("BLOCK_M", "BLOCK_N", "BLOCK_K") if kind == "mamba2" else ("BLOCK_V", "BLOCK_K", "BLOCK_T")
    )
    timed: list[tuple[float, triton.Config]] = []
    for cfg in [*tiles, *grid(names)]:
        kernel.configs = [cfg]
        try:
            ms = float(do_bench(launch, warmup=10, rep=50, return_mode="median"))
        except Exception as exc:  # out of resources: the config does not fit, skip it
            yield {**head, "config": str(cfg), "error": f"{type(exc).__name__}"}
            continue
        timed.append((ms, cfg))
        yield {**head, "config": str(cfg), "default": cfg in tiles, "ms": ms}
    best = min(timed, key=lambda t: t[0])[1]
    kernel.configs = [best]
    defaults = launcher.__kwdefaults__
    assert defaults is not None and defaults["precision"] == PRECISIONS[0]
    for precision in PRECISIONS:
        defaults["precision"] = precision
        ms = float(do_bench(launch, warmup=10, rep=50, return_mode="median"))
        yield {**head, "config": str(best), "precision": precision, "ms": ms}
    defaults["precision"] = PRECISIONS[0]
    kernel.configs = tiles


def mamba2(rows: int, length: int, caps: int) -> Iterator[dict[str, Any]]:
    pf = m2.make_prefill("nemotron-h-8b", rows, length, caps, torch.float32, "cuda")
    run = m2.our_launches(pf, m2.scan_outputs(pf))
    head = {"kind": "mamba2", "packing": f"{rows}x{length}", "captures": len(pf.caps)}
    yield from sweep("mamba2", ssd_capture._ssd_capture_kernel, ssd_capture.capture_ssd_states,
                     run.ssd, head)  # fmt: skip


def gdn(rows: int, length: int, caps: int) -> Iterator[dict[str, Any]]:
    pf = gd.make_prefill("qwen3-next-80b", rows, length, caps, torch.bfloat16, "cuda")
    with gd.recorded() as seen:
        gd.chunk_forward(pf)()
    run = gd.our_launches(pf, seen)
    head = {"kind": "gdn", "packing": f"{rows}x{length}", "captures": len(pf.caps)}
    yield from sweep("gdn", gdn_capture._gdn_capture_kernel, gdn_capture.capture_gdn_states,
                     run.capture, head)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kinds", default="mamba2,gdn")
    kinds = parser.parse_args().kinds.split(",")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for kind, make in (("mamba2", mamba2), ("gdn", gdn)):
        if kind not in kinds:
            continue
        for packing in PACKINGS:
            for row in make(*packing):
                print(json.dumps(row), flush=True)
                key = (kind, row["packing"])
                if "ms" in row and (key not in best or row["ms"] < best[key]["ms"]):
                    best[key] = row
            kb._release_memory()
    for row in best.values():
        print(json.dumps(row), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
