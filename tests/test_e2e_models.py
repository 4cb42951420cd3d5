"""`make e2e-models` on a subset: one Mamba2 hybrid, one linear-attention (Gated DeltaNet) and
one sliding-window family, each served stock and with --enable-jenga on CPU (bench/e2e_models.py).

For each: the server comes up with our backend, the greedy replies of the whole session are the
stock server's, and the second turn hits at least what SGLang's own cache hits. Six server
starts: several minutes on 2 shared cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jenga_sglang.bench.e2e_models import PROMPT, run_models

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

SUBSET = ("falcon_h1", "qwen3_5", "gemma3")


def test_subset_served_identical_and_hits_at_least_stock(tmp_path: Path) -> None:
    rows = run_models(SUBSET, tmp_path / "out", tmp_path / "data")
    assert [r["family"] for r in rows] == list(SUBSET)
    for row in rows:
        assert row["served"], row
        assert row["identical_outputs"], row
        assert row["cached_tokens_turn2"] >= row["stock_cached_tokens_turn2"], row
        # Turn 2 starts with turn 1's whole prompt; our tree keeps it (state and KV).
        assert row["cached_tokens_turn2"] >= PROMPT, row
        log = (tmp_path / "out" / f"{row['family']}-jenga.log").read_text(errors="replace")
        assert "impl=JengaRadixCache" in log
