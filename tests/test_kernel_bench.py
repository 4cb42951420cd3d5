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

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.exactness, pytest.mark.sglang]


def test_smoke_measures_every_kind_and_the_routes_agree() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jenga_sglang.bench.studies.kernel_bench", "--smoke"],
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
    assert by["mamba2-track"]["captures"] == by["mamba2-track"]["rows"] == 4  # one per row
    for kind, routes in (
        ("mamba2-exact", ("ours_err", "sglang_track_err", "sglang_prefix_err")),
        ("gdn-exact", ("ours_err", "sglang_prefix_err")),
    ):
        row = by[kind]
        assert row["dtype"] == "float32" and row["state_absmax"] > 0.5
        for route in routes:
            assert row[route] <= 1e-5 * max(1.0, row["state_absmax"]), (kind, route, row)
    assert "| packing |" in done.stderr  # the table
