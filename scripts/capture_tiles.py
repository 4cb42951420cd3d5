"""Sweep the capture kernels' launch configurations on a GPU (no SGLang needed beyond .gpu/).

kernels/ssd_capture.py and kernels/gdn_capture.py autotune among a few tiles each. This times
every configuration of a wider grid (``GRIDS``: tiles, warps, pipeline stages) and each dot
precision at kernel_bench's packings, one configuration at a time, so a change of TILES or of
the default precision rests on measurements. One JSON object per (kind, packing, config) on
stdout, the best per packing on stderr; ``--out FILE`` writes the three configs of least
geometric-mean time over the packings, per kind, which ``kernel_bench --tiles FILE`` then times.

    scripts/sglang-gpu-ops.sh .gpu                                  # where SGLang is installed
    PYTHONPATH=.:.gpu python scripts/capture_tiles.py [--kinds mamba2,gdn] [--out tiles.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import triton
from triton.testing import do_bench

from jenga_sglang.bench.studies import kernel_bench as kb
from jenga_sglang.kernels.ssd_capture import PRECISIONS  # the GDN capture takes the same

PACKINGS = ((8, 1024, 16), (8, 1024, 127), (64, 128, 64))
TILE_NAMES = {"mamba2": ("BLOCK_M", "BLOCK_N", "BLOCK_K"), "gdn": ("BLOCK_V", "BLOCK_K", "BLOCK_T")}


#: (rows, cols, warps, stages) swept per kind. Mamba2's as its last sweep ran them (H200,
#: 2026-11-29): two stages had won the one before; 128 rows is masked past a 64-dim head.
GRIDS = {
    "mamba2": ((32, 64, 128), (64, 128), (4, 8), (2,)),
    "gdn": ((32, 64), (64, 128), (4, 8), (2, 3)),
}


def grid(kind: str) -> Iterator[triton.Config]:
    """The kind's tiles x warps x stages at 16 tokens per step (32 and 64 lost everywhere in
    the first sweep), the 4-warp ones also capped at 128 registers (4 programs per SM)."""
    rows, cols, toks = TILE_NAMES[kind]
    for m, n, warps, stages in itertools.product(*GRIDS[kind]):
        tile = {rows: m, cols: n, toks: 16}
        yield triton.Config(tile, num_warps=warps, num_stages=stages)
        if warps == 4:
            yield triton.Config(tile, num_warps=warps, num_stages=stages, maxnreg=128)


def sweep(
    kind: str,
    kernel: Any,
    launches: Callable[[str], Callable[[], None]],
    head: dict[str, Any],
) -> Iterator[dict[str, Any]]:
    """Every config at the default precision, then every precision at the best config;
    ``launches(precision)`` is the launch at that dot precision."""
    launch = launches(PRECISIONS[0])
    tiles = list(kernel.configs)
    timed: list[tuple[float, triton.Config]] = []
    seen: set[str] = set()
    for cfg in [*tiles, *grid(kind)]:
        if str(cfg) in seen:
            continue
        seen.add(str(cfg))
        kernel.configs = [cfg]
        try:
            ms = float(do_bench(launch, warmup=10, rep=50, return_mode="median"))
        except Exception as exc:  # out of resources: the config does not fit, skip it
            yield {**head, "config": str(cfg), "error": f"{type(exc).__name__}"}
            continue
        timed.append((ms, cfg))
        yield {**head, "config": str(cfg), "default": cfg in tiles, "ms": ms, "_config": cfg}
    best = min(timed, key=lambda t: t[0])[1]
    kernel.configs = [best]
    for precision in PRECISIONS:
        ms = float(do_bench(launches(precision), warmup=10, rep=50, return_mode="median"))
        yield {**head, "config": str(best), "precision": precision, "ms": ms}
    kernel.configs = tiles


def sweep_packing(kind: str, rows: int, length: int, caps: int) -> Iterator[dict[str, Any]]:
    n, launches = kb.capture_launches(kind, rows, length, caps)
    head = {"kind": kind, "packing": f"{rows}x{length}", "captures": n}
    yield from sweep(kind, kb.capture_kernel(kind), launches, head)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kinds", default="mamba2,gdn")
    parser.add_argument("--out", type=Path, help="write each kind's three best configs here")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    best: dict[tuple[str, str], dict[str, Any]] = {}
    times: dict[str, dict[str, list[float]]] = {}  # kind -> config -> ms per packing
    configs: dict[str, triton.Config] = {}
    for kind in ("mamba2", "gdn"):
        if kind not in kinds:
            continue
        for packing in PACKINGS:
            for row in sweep_packing(kind, *packing):
                config = row.pop("_config", None)
                print(json.dumps(row), flush=True)
                key = (kind, row["packing"])
                if "ms" in row and (key not in best or row["ms"] < best[key]["ms"]):
                    best[key] = row
                if config is not None:
                    times.setdefault(kind, {}).setdefault(row["config"], []).append(row["ms"])
                    configs[row["config"]] = config
            kb._release_memory()
    for row in best.values():
        print(json.dumps(row), file=sys.stderr)
    if args.out is not None:
        args.out.write_text(json.dumps(top3(times, configs, len(PACKINGS)), indent=1))
    return 0


def top3(
    times: dict[str, dict[str, list[float]]], configs: dict[str, triton.Config], packings: int
) -> dict[str, list[dict[str, Any]]]:
    """Per kind, the three configs of least geometric-mean time over the packings (only configs
    that ran at every packing)."""
    chosen = {}
    for kind, by_cfg in times.items():
        full = {c: ms for c, ms in by_cfg.items() if len(ms) == packings}
        ranked = sorted(full, key=lambda c: math.fsum(math.log(m) for m in full[c]))
        chosen[kind] = [kb.tile_record(configs[c]) for c in ranked[:3]]
    return chosen


if __name__ == "__main__":
    raise SystemExit(main())
