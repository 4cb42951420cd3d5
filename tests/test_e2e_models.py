"""`make e2e-models` on a subset, served stock and with --enable-jenga on CPU
(bench/studies/e2e_models.py): Falcon-H1 (Mamba2 and attention in one block) and Gemma 3
(sliding-window and full attention in SGLang's one KV pool); and, in its own test, the
linear-attention family (Qwen3.5: Gated DeltaNet and attention), which stock SGLang serves on CPU
under the plugin's CPU mode (jenga_sglang/cpu_gdn.py).

For each: our backend serves it, the greedy replies of the whole session are the stock
server's, and the hits are what they must be: for Gemma 3 exactly SGLang's own cache's (every
layer keeps every token's KV there); for Falcon-H1 turn 2 at least stock's and the second branch
resumes at the branch point, where stock's no_buffer cache holds no state. Four server starts:
several minutes on 2 shared cores, and two more (about 6 minutes) for Qwen3.5.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jenga_sglang.bench.studies.e2e_models import BRANCH_AT, PROMPT, run_models

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

SUBSET = ("falcon_h1", "gemma3")


def test_subset_served_identical_and_hits_as_expected(tmp_path: Path) -> None:
    rows = {r["family"]: r for r in run_models(SUBSET, tmp_path / "out", tmp_path / "data")}
    assert sorted(rows) == sorted(SUBSET)
    for family, row in rows.items():
        assert row["served"] and row["identical_outputs"], row
        assert row["cached_tokens_turn2"] >= max(PROMPT, row["stock_cached_tokens_turn2"]), row
        log = (tmp_path / "out" / f"{family}-jenga.log").read_text(errors="replace")
        assert "impl=JengaRadixCache" in log
    gemma = rows["gemma3"]
    assert gemma["cached_tokens_turn2"] == gemma["stock_cached_tokens_turn2"]
    assert gemma["cached_tokens_branch"] == gemma["stock_cached_tokens_branch"] == BRANCH_AT
    falcon = rows["falcon_h1"]
    assert falcon["cached_tokens_branch"] == BRANCH_AT > falcon["stock_cached_tokens_branch"]


def test_gated_deltanet_served_identical_and_resumes_at_the_branch(tmp_path: Path) -> None:
    """Qwen3.5 (chunk-cut capture of the GDN and conv states): replies identical to stock's,
    turn 2 hits at least what stock hits, the second branch resumes at the branch point."""
    (row,) = run_models(("qwen3_5",), tmp_path / "out", tmp_path / "data")
    assert row["served"] and row["identical_outputs"], row
    assert row["cached_tokens_turn2"] >= max(PROMPT, row["stock_cached_tokens_turn2"]), row
    assert row["cached_tokens_branch"] == BRANCH_AT > row["stock_cached_tokens_branch"], row
    log = (tmp_path / "out" / "qwen3_5-jenga.log").read_text(errors="replace")
    assert "impl=JengaRadixCache" in log
