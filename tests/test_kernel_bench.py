"""The capture benchmark's smoke run: it runs, and its two capture routes agree.

`python -m jenga_sglang.bench.studies.kernel_bench --smoke` times our in-pass capture (conv gather
plus roll-forward from the scan's chunk states) against SGLang's tracked-state route on the same
packed prefill; the SSM states of both routes must be the same to fp32 rounding, or the benchmark
compares two different computations.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.exactness, pytest.mark.sglang]


def test_smoke_routes_agree_and_times_are_measured() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jenga_sglang.bench.studies.kernel_bench", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["bench"] == "capture" and row["model"] == "smoke"
    assert row["captures"] == 8 and row["tokens"] == 4 * 40
    assert row["routes_max_abs_diff"] <= 1e-5
    for key in ("layer_forward_s", "capture_s", "sglang_track_s"):
        assert row[key] > 0, key
