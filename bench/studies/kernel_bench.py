"""What in-pass capture costs a prefill, and how exact it is (GPU), or a smoke run on CPU.

Two layer kinds, each at a production model's layer shapes (tensor-parallel rank 1):

* Mamba2 at Nemotron-H-8B's (bench/studies/kernel_mamba2.py): SGLang's scan, our capture (conv
  gather plus the chunked capture from the scan's own chunk states, dt and dA cumsum), the
  earlier sequential roll-forward, and SGLang's in-scan tracking of one position per row;
* Gated DeltaNet at Qwen3-Next-80B's (bench/studies/kernel_gdn.py): SGLang's chunked FLA
  prefill, our capture from its chunk states and delta values, and SGLang's own route (states
  at chunk boundaries only, copied out of the chunk states).

Measurements, one JSON object per line on stdout (`bench` names the kind), a table at the end
on stderr:

* `mamba2` / `gdn`: per packing (rows x tokens, captures), the layer's prefill forward, our
  capture, its share of the forward, per capture, and `in_layer_ms` (the layer followed by our
  launches, minus the layer alone: timed as SGLang's in-scan tracking is);
* `mamba2-track` / `gdn-route`: one capture per row, SGLang's route beside ours;
* `mamba2-exact` / `gdn-exact`: max abs error against a float64 truth of ours, SGLang's route
  and SGLang's prefill of the prefix alone, for fp32 and bf16 activations (GDN: bf16 only on a
  GPU, where SGLang's kernel refuses float32; float32 only on CPU).

On a GPU machine with PyTorch and Triton but no SGLang, SGLang's Triton ops are copied next to
the checkout first (docs/kernels.md, "Running the benchmark on a GPU"):

    scripts/sglang-gpu-ops.sh .gpu          # where SGLang is installed
    PYTHONPATH=.:.gpu python -m jenga_sglang.bench.studies.kernel_bench   # on the GPU machine

`--tiles FILE` times with the tiles `scripts/capture_tiles.py --out FILE` chose instead of the
kernels' own. `--smoke` runs tiny shapes on CPU under the Triton interpreter (patches from
tests/triton_cpu.py): it proves the benchmark runs and checks agreement; interpreter timings
measure Python, not kernels.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

#: (rows, tokens per row, captures): the packings issue #28 measured on an H100.
PACKINGS = ((8, 1024, 16), (8, 1024, 127), (4, 8192, 64), (64, 128, 64), (1, 32768, 8),
            (32, 1024, 256))  # fmt: skip
EXACT_PACKINGS = ((8, 1024, 16), (64, 128, 64))
#: The production model each layer kind is measured at (tensor-parallel rank 1).
MODELS = {"mamba2": "nemotron-h-8b", "gdn": "qwen3-next-80b"}
SMOKE_PACKINGS = ((4, 40, 8),)


@dataclass(frozen=True)
class Timer:
    """Median time of ``fn`` in milliseconds.

    On a GPU, Triton's ``do_bench``: CUDA events around each call, L2 flushed between calls, so
    a figure is the kernel's cold-cache time without the host's launch latency (a capture's
    inputs, the chunk states, outgrow L2 in a real prefill anyway). On CPU, wall time.
    """

    device: str
    repeats: int  # CPU only

    def __call__(self, fn: Callable[[], Any]) -> float:
        fn()  # warm-up (compilation, autotuning)
        if self.device == "cuda":
            from triton.testing import do_bench

            return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
        times = []
        for _ in range(self.repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1e3 * sorted(times)[len(times) // 2]


@dataclass(frozen=True)
class Config:
    model_mamba2: str
    model_gdn: str
    packings: tuple[tuple[int, int, int], ...]
    exact_packings: tuple[tuple[int, int, int], ...]
    timer: Timer
    kinds: tuple[str, ...]


def _dtypes(cfg: Config, kind: str) -> list[Any]:
    import torch

    gpu = cfg.timer.device == "cuda"
    if kind == "gdn":
        return [torch.bfloat16] if gpu else [torch.float32]
    # bf16 dot products are wrong under the interpreter (jenga_sglang/cpu_gdn.py)
    return [torch.float32, torch.bfloat16] if gpu else [torch.float32]


def _name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def mamba2_rows(cfg: Config) -> Iterable[dict[str, Any]]:
    for p in cfg.packings:
        yield from _guarded("mamba2", p, partial(_mamba2_timing, cfg, *p))
    for p in cfg.exact_packings:
        for dtype in _dtypes(cfg, "mamba2"):
            yield from _guarded("mamba2-exact", p, partial(_mamba2_exact, cfg, *p, dtype))


def _mamba2_timing(cfg: Config, rows: int, length: int, caps: int) -> list[dict[str, Any]]:
    import torch

    from jenga_sglang.bench.studies import kernel_mamba2 as m2

    dev, t = cfg.timer.device, cfg.timer
    pf = m2.make_prefill(cfg.model_mamba2, rows, length, caps, torch.float32, dev)
    run = m2.our_launches(pf, m2.scan_outputs(pf))
    row = _head("mamba2", cfg.model_mamba2, rows, length, len(pf.caps), "float32", dev)
    layer = m2.layer_forward(pf)
    row["layer_forward_ms"] = t(layer)
    row["conv_gather_ms"] = t(run.conv)
    row["ssd_capture_ms"] = t(run.ssd)
    row["in_layer_ms"] = t(_chain(layer, run.conv, run.ssd)) - row["layer_forward_ms"]
    row["tile"] = _tile(capture_kernel("mamba2"))
    row["sequential_ms"] = t(run.sequential)
    one = m2.make_prefill(cfg.model_mamba2, rows, length, rows, torch.float32, dev, seed=1)
    track = _head("mamba2-track", cfg.model_mamba2, rows, length, len(one.caps), "float32", dev)
    return [
        _shares(row, row["conv_gather_ms"] + row["ssd_capture_ms"]),
        _mamba2_track(one, t, track),
    ]


def _mamba2_exact(
    cfg: Config, rows: int, length: int, caps: int, dtype: Any
) -> list[dict[str, Any]]:
    from jenga_sglang.bench.studies import kernel_mamba2 as m2

    dev = cfg.timer.device
    pf = m2.make_prefill(cfg.model_mamba2, rows, length, caps, dtype, dev)
    row = _head("mamba2-exact", cfg.model_mamba2, rows, length, len(pf.caps), _name(dtype), dev)
    scan = m2.scan_outputs(pf)
    run, plain = m2.our_launches(pf, scan), m2.our_launches(pf, scan, precision="tf32")
    run.ssd()
    plain.ssd()
    truth = m2.truth_states(pf)
    row["state_absmax"] = float(truth.abs().max())
    row["ours_err"] = _err(run.ssm_out, truth)
    row["ours_tf32_err"] = _err(plain.ssm_out, truth)
    row["sglang_track_err"] = _err(m2.sglang_tracked_states(pf), truth)
    row["sglang_prefix_err"] = _err(m2.sglang_prefix_states(pf), truth)
    return [row]


def _mamba2_track(pf: Any, t: Timer, row: dict[str, Any]) -> dict[str, Any]:
    from jenga_sglang.bench.studies import kernel_mamba2 as m2

    row["scan_ms"] = t(m2.mixer_scan(pf))
    row["scan_tracked_ms"] = t(m2.mixer_scan(pf, [pf.flat(i) for i in range(len(pf.caps))]))
    row["sglang_extra_ms"] = row["scan_tracked_ms"] - row["scan_ms"]
    run = m2.our_launches(pf, m2.scan_outputs(pf))
    row["ours_ssd_ms"] = t(run.ssd)
    row["ours_conv_ms"] = t(run.conv)
    return row


def gdn_rows(cfg: Config) -> Iterable[dict[str, Any]]:
    dtype = _dtypes(cfg, "gdn")[0]
    for p in cfg.packings:
        yield from _guarded("gdn", p, partial(_gdn_timing, cfg, *p, dtype))
    for p in cfg.exact_packings:
        yield from _guarded("gdn-exact", p, partial(_gdn_exact, cfg, *p, dtype))


def _gdn_timing(cfg: Config, rows: int, length: int, caps: int, dtype: Any) -> list[dict[str, Any]]:
    from jenga_sglang.bench.studies import kernel_gdn as gd

    dev, t = cfg.timer.device, cfg.timer
    pf = gd.make_prefill(cfg.model_gdn, rows, length, caps, dtype, dev)
    forward = gd.chunk_forward(pf)
    with gd.recorded() as seen:
        forward()
    run = gd.our_launches(pf, seen)
    row = _head("gdn", cfg.model_gdn, rows, length, len(pf.caps), _name(dtype), dev)
    layer = gd.layer_forward(pf)
    row["layer_forward_ms"] = t(layer)
    row["chunk_forward_ms"] = t(forward)
    row["conv_gather_ms"] = t(run.conv)
    row["gdn_capture_ms"] = t(run.capture)
    row["in_layer_ms"] = t(_chain(layer, run.conv, run.capture)) - row["layer_forward_ms"]
    row["tile"] = _tile(capture_kernel("gdn"))
    row = _shares(row, row["conv_gather_ms"] + row["gdn_capture_ms"])
    row["chunk_forward_share"] = row["capture_ms"] / row["chunk_forward_ms"]
    route = _head("gdn-route", cfg.model_gdn, rows, length, len(pf.caps), _name(dtype), dev)
    route["sglang_copy_ms"] = t(run.sglang_copy)
    route["ours_capture_ms"] = row["gdn_capture_ms"]
    return [row, route]


def _gdn_exact(cfg: Config, rows: int, length: int, caps: int, dtype: Any) -> list[dict[str, Any]]:
    from jenga_sglang.bench.studies import kernel_gdn as gd

    dev = cfg.timer.device
    pf = gd.make_prefill(cfg.model_gdn, rows, length, caps, dtype, dev)
    with gd.recorded() as seen:
        gd.chunk_forward(pf)()
    run, plain = gd.our_launches(pf, seen), gd.our_launches(pf, seen, precision="tf32")
    run.capture()
    plain.capture()
    truth = gd.truth_states(pf)
    row = _head("gdn-exact", cfg.model_gdn, rows, length, len(pf.caps), _name(dtype), dev)
    row["state_absmax"] = float(truth.abs().max())
    row["ours_err"] = _err(run.out, truth)
    row["ours_tf32_err"] = _err(plain.out, truth)
    row["sglang_prefix_err"] = _err(gd.sglang_prefix_states(pf), truth)
    return [row]


def _guarded(
    bench: str, packing: tuple[int, int, int], measure: Callable[[], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """One packing's rows, or one row naming its error: a failure (out of memory on a smaller
    GPU, say) costs that packing, not the rest of the run."""
    try:
        return measure()
    except Exception as exc:  # reported in the output; the run goes on
        traceback.print_exc(file=sys.stderr)
        rows, length, caps = packing
        return [{"bench": bench, "packing": f"{rows}x{length}", "captures": caps,
                 "error": f"{type(exc).__name__}: {exc}"}]  # fmt: skip
    finally:
        _release_memory()


def _release_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _head(
    bench: str, model: str, rows: int, length: int, caps: int, dtype: str, dev: str
) -> dict[str, Any]:
    return {"bench": bench, "model": model, "packing": f"{rows}x{length}", "rows": rows,
            "tokens": rows * length, "captures": caps, "dtype": dtype, "device": dev}  # fmt: skip


def _shares(row: dict[str, Any], capture_ms: float) -> dict[str, Any]:
    row["capture_ms"] = capture_ms
    row["capture_share"] = capture_ms / row["layer_forward_ms"]
    row["in_layer_share"] = row["in_layer_ms"] / row["layer_forward_ms"]
    row["per_capture_us"] = 1e3 * capture_ms / max(row["captures"], 1)
    return row


def _chain(*fns: Callable[[], Any]) -> Callable[[], None]:
    """One timed call running ``fns`` in order: a capture timed behind the layer it follows,
    as a prefill runs it (its launch latency hidden behind the layer's kernels, as in a live
    forward), to compare with SGLang's in-scan tracking, timed the same way."""

    def run() -> None:
        for fn in fns:
            fn()

    return run


def _tile(kernel: Any) -> str:
    """The autotuner's pick for the launches just timed."""
    best = getattr(kernel, "best_config", None)
    return "" if best is None else str(best)


def capture_kernel(kind: str) -> Any:
    """The autotuned capture kernel of a layer kind (`configs`: the tiles it tries)."""
    from jenga_sglang.kernels import gdn_capture, ssd_capture

    return ssd_capture._ssd_capture_kernel if kind == "mamba2" else gdn_capture._gdn_capture_kernel


def capture_launches(
    kind: str, rows: int, length: int, caps: int
) -> tuple[int, Callable[[str], Callable[[], None]]]:
    """A packing's prefill on the GPU at `MODELS[kind]`'s shapes: its capture count, and our
    capture launch for it at a dot precision (built when asked for, so the launcher is imported
    then: scripts/capture_compare.py swaps in an earlier one)."""
    import torch

    from jenga_sglang.bench.studies import kernel_gdn as gd
    from jenga_sglang.bench.studies import kernel_mamba2 as m2

    if kind == "mamba2":
        mp = m2.make_prefill(MODELS[kind], rows, length, caps, torch.float32, "cuda")
        scan = m2.scan_outputs(mp)
        return len(mp.caps), lambda p: m2.our_launches(mp, scan, precision=p).ssd
    gp = gd.make_prefill(MODELS[kind], rows, length, caps, torch.bfloat16, "cuda")
    with gd.recorded() as seen:
        gd.chunk_forward(gp)()
    return len(gp.caps), lambda p: gd.our_launches(gp, seen, precision=p).capture


def tile_record(config: Any) -> dict[str, Any]:
    """A Triton config as JSON (scripts/capture_tiles.py writes these; `--tiles` reads them)."""
    return {"kwargs": dict(config.kwargs), "num_warps": config.num_warps,
            "num_stages": config.num_stages, "maxnreg": config.maxnreg}  # fmt: skip


def use_tiles(path: Path) -> None:
    """Time with the tiles a sweep chose (``{"mamba2": [...], "gdn": [...]}``, each a list of
    `tile_record`s) instead of the kernels' own: the autotuner picks among them as usual."""
    import triton

    chosen = json.loads(path.read_text())
    for kind, records in chosen.items():
        if kind not in MODELS or not records:
            raise ValueError(f"{path}: expected non-empty lists under {sorted(MODELS)}")
        capture_kernel(kind).configs = [
            triton.Config(
                r["kwargs"],
                num_warps=r["num_warps"],
                num_stages=r["num_stages"],
                maxnreg=r.get("maxnreg"),
            )
            for r in records
        ]


def _err(got: Any, truth: Any) -> float:
    return float((got.double() - truth).abs().max())


def table(rows: list[dict[str, Any]]) -> str:
    """The measurements as one markdown table per kind."""
    cols = {
        "mamba2": ("packing", "captures", "layer_forward_ms", "capture_ms", "capture_share",
                   "per_capture_us", "ssd_capture_ms", "conv_gather_ms", "in_layer_ms",
                   "in_layer_share", "sequential_ms"),
        "mamba2-track": ("packing", "captures", "scan_ms", "scan_tracked_ms", "sglang_extra_ms",
                         "ours_ssd_ms", "ours_conv_ms"),
        "mamba2-exact": ("packing", "captures", "dtype", "state_absmax", "ours_err",
                         "ours_tf32_err", "sglang_track_err", "sglang_prefix_err"),
        "gdn": ("packing", "captures", "layer_forward_ms", "chunk_forward_ms", "capture_ms",
                "capture_share", "chunk_forward_share", "per_capture_us", "in_layer_ms",
                "in_layer_share"),
        "gdn-route": ("packing", "captures", "ours_capture_ms", "sglang_copy_ms"),
        "gdn-exact": ("packing", "captures", "dtype", "state_absmax", "ours_err",
                      "ours_tf32_err", "sglang_prefix_err"),
    }  # fmt: skip
    out = []
    for bench, names in cols.items():
        mine = [r for r in rows if r["bench"] == bench and "error" not in r]
        if not mine:
            continue
        out += [f"\n{bench} ({mine[0]['model']}, {mine[0]['device']})", "| " + " | ".join(names)
                + " |", "|" + "---|" * len(names)]  # fmt: skip
        out += ["| " + " | ".join(_cell(r.get(n)) for n in names) + " |" for r in mine]
    out += [f"\n{r['bench']} {r['packing']} failed: {r['error']}" for r in rows if "error" in r]
    return "\n".join(out)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.0f}"
    return "" if v is None else str(v)


def _load_interpreter_patches() -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    helper = Path(__file__).resolve().parents[2] / "tests" / "triton_cpu.py"
    spec = importlib.util.spec_from_file_location("triton_cpu", helper)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load the interpreter helper {helper}")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kernels", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (interpreter)")
    parser.add_argument("--kinds", default="mamba2,gdn", help="mamba2, gdn or both")
    parser.add_argument("--tiles", type=Path, help="JSON of tiles to time (capture_tiles --out)")
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if not kinds or set(kinds) - {"mamba2", "gdn"}:
        parser.error(f"--kinds takes mamba2 and/or gdn, got {args.kinds!r}")
    if args.smoke:
        _load_interpreter_patches()
        cfg = Config("smoke", "smoke", SMOKE_PACKINGS, SMOKE_PACKINGS[:1], Timer("cpu", 1), kinds)
    else:
        import torch

        if not torch.cuda.is_available():
            parser.error("no GPU: run with --smoke on CPU")
        cfg = Config(MODELS["mamba2"], MODELS["gdn"], PACKINGS, EXACT_PACKINGS,
                     Timer("cuda", 0), kinds)  # fmt: skip
    if args.tiles is not None:
        use_tiles(args.tiles)
    rows: list[dict[str, Any]] = []
    for kind, make in (("mamba2", mamba2_rows), ("gdn", gdn_rows)):
        if kind in kinds:
            for row in make(cfg):
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(table(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
