"""The capture benchmark's smoke run: it runs, and every route it compares computes the same.

`python -m jenga_sglang.bench.studies.kernel_bench --smoke` measures, on tiny shapes under the
Triton interpreter, both layer kinds: our in-pass capture against the layer's prefill forward
and SGLang's own route, and the exactness of ours, SGLang's route and SGLang's prefill of the
prefix alone against a float64 truth. On fp32 inputs all of them must agree with the truth to
fp32 rounding, or the benchmark compares different computations.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.exactness, pytest.mark.sglang]


MAMBA2_TILE = {"kwargs": {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 16}, "num_warps": 4,
               "num_stages": 2, "maxnreg": 128}  # fmt: skip
GDN_TILES = [
    {"kwargs": {"BLOCK_V": 32, "BLOCK_K": 64, "BLOCK_T": 16}, "num_warps": 4, "num_stages": s,
     "maxnreg": None}
    for s in (2, 3)
]  # fmt: skip


def test_smoke_measures_every_kind_and_the_routes_agree(tmp_path: Path) -> None:
    tiles = tmp_path / "tiles.json"  # a sweep's choice (scripts/capture_tiles.py --out)
    tiles.write_text(json.dumps({"mamba2": [MAMBA2_TILE], "gdn": GDN_TILES}))
    command = [sys.executable, "-m", "jenga_sglang.bench.studies.kernel_bench", "--smoke"]
    done = subprocess.run(
        [*command, "--tiles", str(tiles)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by = {r["bench"]: r for r in rows}
    assert set(by) == {"mamba2", "mamba2-track", "mamba2-exact", "gdn", "gdn-route", "gdn-exact"}
    m2, gdn = by["mamba2"], by["gdn"]
    assert m2["packing"] == gdn["packing"] == "4x40" and m2["captures"] == gdn["captures"] == 8
    for row, keys in (
        (m2, ("layer_forward_ms", "ssd_capture_ms", "conv_gather_ms", "sequential_ms")),
        (by["mamba2-track"], ("scan_ms", "scan_tracked_ms", "ours_ssd_ms")),
        (gdn, ("layer_forward_ms", "chunk_forward_ms", "gdn_capture_ms", "conv_gather_ms")),
        (by["gdn-route"], ("sglang_copy_ms", "ours_capture_ms")),
    ):
        assert all(row[k] > 0 for k in keys), row
    assert m2["capture_ms"] == pytest.approx(m2["ssd_capture_ms"] + m2["conv_gather_ms"])
    for row in (m2, gdn):  # timed behind the layer: a difference of two timings, any sign on CPU
        assert row["in_layer_share"] == pytest.approx(row["in_layer_ms"] / row["layer_forward_ms"])
    # the autotuner ran on the given tiles only
    assert "BLOCK_M: 32, BLOCK_N: 64" in m2["tile"] and "maxnreg: 128" in m2["tile"]
    assert "BLOCK_V: 32, BLOCK_K: 64" in gdn["tile"]
    assert by["mamba2-track"]["captures"] == by["mamba2-track"]["rows"] == 4  # one per row
    for kind, routes in (
        ("mamba2-exact", ("ours_err", "ours_tf32_err", "sglang_track_err", "sglang_prefix_err")),
        ("gdn-exact", ("ours_err", "ours_tf32_err", "sglang_prefix_err")),
    ):
        row = by[kind]
        assert row["dtype"] == "float32" and row["state_absmax"] > 0.5
        for route in routes:
            assert row[route] <= 1e-5 * max(1.0, row["state_absmax"]), (kind, route, row)
    assert "| packing |" in done.stderr  # the table


def test_a_tiles_file_with_an_empty_list_or_unknown_kind_is_refused(tmp_path: Path) -> None:
    from jenga_sglang.bench.studies.kernel_bench import use_tiles

    bad = tmp_path / "tiles.json"
    contents: list[dict[str, list[Any]]] = [{"mamba2": []}, {"mamba3": [{"kwargs": {}}]}]
    for content in contents:
        bad.write_text(json.dumps(content))
        with pytest.raises(ValueError, match="non-empty lists"):
            use_tiles(bad)


def test_the_sweep_keeps_the_three_of_least_geometric_mean() -> None:
    """scripts/capture_tiles.py ranks configs by geometric mean over the packings and drops any
    that did not run at every packing (out of resources at one, say)."""
    import triton

    tiles = _capture_tiles()
    configs = {f"c{i}": triton.Config({"BLOCK_M": 16 * (i + 1)}, num_warps=4) for i in range(5)}
    times = {"mamba2": {
        "c0": [1.0, 1.0, 1.0],   # geometric mean 1
        "c1": [0.1, 4.0, 4.0],   # 1.17: a lower sum than c2 but a higher geometric mean than c0
        "c2": [2.0, 2.0, 0.1],   # 0.74: best
        "c3": [0.01, 0.01],      # missed a packing: dropped
        "c4": [3.0, 3.0, 3.0],   # fourth
    }}  # fmt: skip
    chosen = tiles.top3(times, configs, 3)["mamba2"]
    assert [c["kwargs"]["BLOCK_M"] for c in chosen] == [48, 16, 32]
    assert chosen[0] == {"kwargs": {"BLOCK_M": 48}, "num_warps": 4, "num_stages": 3,
                         "maxnreg": None}  # fmt: skip


def test_the_sweep_times_each_config_once_and_each_precision_on_its_own_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The precision pass must time launches built at each precision (an earlier version set
    the launcher's default precision, which a launch passing its own ignored)."""
    import types

    import triton

    tiles = _capture_tiles()
    timed: list[tuple[str, str]] = []  # (config, precision) of each timed launch
    kernel = types.SimpleNamespace(configs=[triton.Config({"BLOCK_M": 64}, num_warps=4)])
    default_tiles = list(kernel.configs)

    def launches(precision: str) -> Any:
        return lambda: timed.append((str(kernel.configs[0]), precision))

    def fake_bench(fn: Any, **_: Any) -> float:
        fn()
        return 1.0 if "BLOCK_N: 128" in timed[-1][0] else 2.0  # one config is fastest

    monkeypatch.setattr(tiles, "do_bench", fake_bench)
    rows = list(tiles.sweep("mamba2", kernel, launches, {"kind": "mamba2"}))
    configs = [r["config"] for r in rows if "precision" not in r]
    assert len(configs) == len(set(configs)) == 1 + 18  # the default, then the grid, no repeats
    passes = [(r["config"], r["precision"]) for r in rows if "precision" in r]
    assert [p for _, p in passes] == list(tiles.PRECISIONS)
    assert all("BLOCK_N: 128" in c for c, _ in passes)  # at the best config
    assert [p for _, p in timed[-3:]] == list(tiles.PRECISIONS)  # each on its own launch
    assert kernel.configs == default_tiles  # restored


def test_the_compare_builds_an_earlier_kernels_captures_by_field_name() -> None:
    """scripts/capture_compare.py gives a kernel module from before ``SsdCaptures.of`` one that
    fills its own fields from the geometry's per-capture lists, and leaves a current one be."""
    import dataclasses
    import types

    import torch

    compare = _script("capture_compare")

    @dataclasses.dataclass(frozen=True)
    class Before:  # the contract before chains: per capture, no `chains`
        chunk_src: torch.Tensor
        row_src: torch.Tensor
        dst: torch.Tensor
        start: torch.Tensor
        count: torch.Tensor

    old = compare.with_of(types.SimpleNamespace(SsdCaptures=Before))
    dst = torch.tensor([5, 6])
    caps = old.SsdCaptures.of([1, -1], [-1, 0], [8, 0], [3, 2], [0, 1, 2], dst)
    assert caps.dst is dst and caps.start.tolist() == [8, 0] and caps.row_src.tolist() == [-1, 0]
    from jenga_sglang.kernels import ssd_capture

    current = types.SimpleNamespace(SsdCaptures=ssd_capture.SsdCaptures)
    assert compare.with_of(current).SsdCaptures.of == ssd_capture.SsdCaptures.of


def _capture_tiles() -> Any:
    return _script("capture_tiles")


def _script(name: str) -> Any:
    """scripts/<name>.py as a module (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / f"scripts/{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
