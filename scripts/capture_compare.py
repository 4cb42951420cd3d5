"""Time an earlier version of the capture kernels against the current one, on one GPU, in one run.

A kernel change's before and after must come from the same machine and the same inputs: this
loads the earlier kernels/ssd_capture.py and kernels/gdn_capture.py from a directory (written
with ``git show REV:kernels/ssd_capture.py``, say) and times both versions' launches, alternately,
at kernel_bench's six packings, each on its own autotuned tiles (``--tiles``: the current
kernels' tiles from a sweep, as ``kernel_bench --tiles``). One JSON object per (kind, packing).

    mkdir -p .gpu/old && for k in ssd_capture gdn_capture; do
        git show REV:kernels/$k.py > .gpu/old/$k.py; done                    # here
    PYTHONPATH=.:.gpu python scripts/capture_compare.py --old .gpu/old      # on the GPU

The bench builds Mamba2 launches with ``SsdCaptures.of`` (kernels since 2026-11-29); an
earlier ssd_capture.py gets one here that fills its own fields, by name, with the geometry's
per-capture lists (``with_of``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from jenga_sglang.bench.studies import kernel_bench as kb

PRECISION = "tf32x3"  # both versions' default
MODULES = {"mamba2": "jenga_sglang.kernels.ssd_capture", "gdn": "jenga_sglang.kernels.gdn_capture"}


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_of(module: ModuleType) -> ModuleType:
    """``module`` with ``SsdCaptures.of`` where it predates it: every field from the geometry's
    per-capture list of that name (kernels before per-chain fields took them per capture)."""
    caps = module.SsdCaptures
    if hasattr(caps, "of"):
        return module

    def of(cls: Any, chunk_src: Any, row_src: Any, start: Any, count: Any, chains: Any,
           dst: Any) -> Any:  # fmt: skip
        lists = {"chunk_src": chunk_src, "row_src": row_src, "start": start, "count": count,
                 "chains": chains}  # fmt: skip

        def ids(values: Any) -> Any:
            return torch.tensor(values, dtype=torch.int64, device=dst.device)

        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: dst if n == "dst" else ids(lists[n]) for n in names})

    caps.of = classmethod(of)
    return module


def built_with(kind: str, module: ModuleType, build: Callable[[], Any]) -> Any:
    """``build()`` with the earlier module standing in for the current one (the bench builders
    import the kernels' launchers when they run)."""
    saved = sys.modules[MODULES[kind]]
    sys.modules[MODULES[kind]] = module
    try:
        return build()
    finally:
        sys.modules[MODULES[kind]] = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--old", type=Path, required=True, help="directory of the earlier kernels")
    parser.add_argument("--tiles", type=Path, help="the current kernels' tiles (capture_tiles)")
    parser.add_argument("--kinds", default="mamba2,gdn")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    if args.tiles is not None:
        kb.use_tiles(args.tiles)
    old = {
        "mamba2": with_of(load(args.old / "ssd_capture.py", "old_ssd_capture")),
        "gdn": load(args.old / "gdn_capture.py", "old_gdn_capture"),
    }
    ms = kb.Timer("cuda", 0)
    for kind in args.kinds.split(","):
        for packing in kb.PACKINGS:
            n, launches = kb.capture_launches(kind, *packing)
            before = built_with(kind, old[kind], partial(launches, PRECISION))
            after = launches(PRECISION)
            row: dict[str, Any] = {"kind": kind, "packing": f"{packing[0]}x{packing[1]}"}
            row |= {"captures": n, "old_ms": ms(before), "new_ms": ms(after)}
            row["old_ms_again"], row["new_ms_again"] = ms(before), ms(after)
            print(json.dumps(row), flush=True)
            kb._release_memory()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
