"""`make e2e-models` on a subset, served stock and with --enable-jenga on CPU
(bench/studies/e2e_models.py), one family of each cache kind:

* Falcon-H1 (Mamba2 and attention in one block), page 1;
* gpt-oss (sliding-window and full attention in SGLang's SWA pool; ours on the Jenga pool) at
  --page-size 16, where hits are whole pages;
* Qwen3.5 (Gated DeltaNet and attention), which stock SGLang serves on CPU under the plugin's
  CPU mode (jenga_sglang/cpu_gdn.py).

For each: our backend serves it, the greedy replies of the whole session are the stock
server's (log-probabilities within 1e-3), and the hits are what they must be: for gpt-oss
exactly SGLang's own cache's; for the state families turn 2 at least stock's and the second
branch resumes at the branch point (floored to a page), where stock's cache holds no state.
Six server starts: about 15 minutes on 2 shared cores (gpt-oss runs its Triton attention
under the interpreter). `make test` leaves Falcon-H1 to `make test-full`: the tiny NemotronH
covers the Mamba2 kind there (tests/test_e2e_server.py), and `make e2e-models` serves every
family.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jenga_sglang.bench.studies.e2e_models import BRANCH_AT, PROMPT, run_models

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


def _check(row: dict[str, object], out: Path, name: str) -> None:
    assert row["served"] and row["identical_outputs"], row
    assert float(row["max_logprob_diff"]) < 1e-3, row  # type: ignore[arg-type]
    log = (out / f"{name}-jenga.log").read_text(errors="replace")
    assert "impl=JengaRadixCache" in log


@pytest.mark.full  # NemotronH covers the Mamba2 kind in `make test` (tests/test_e2e_server.py)
def test_mamba2_family_served_identical_and_resumes_at_the_branch(tmp_path: Path) -> None:
    (row,) = run_models(("falcon_h1",), tmp_path / "out", tmp_path / "data")
    _check(row, tmp_path / "out", "falcon_h1")
    assert row["cached_tokens_turn2"] >= max(PROMPT, row["stock_cached_tokens_turn2"]), row
    assert row["cached_tokens_branch"] == BRANCH_AT > row["stock_cached_tokens_branch"], row


def test_sliding_window_family_on_pages_hits_as_sglang_does(tmp_path: Path) -> None:
    (row,) = run_models(("gpt_oss",), tmp_path / "out", tmp_path / "data", pages=(16,))
    _check(row, tmp_path / "out", "gpt_oss-p16")
    assert row["page_size"] == 16
    assert row["cached_tokens_turn2"] == row["stock_cached_tokens_turn2"] > 0, row
    assert (
        row["cached_tokens_branch"]
        == row["stock_cached_tokens_branch"]
        == BRANCH_AT - BRANCH_AT % 16
    )
    log = (tmp_path / "out" / "gpt_oss-p16-jenga.log").read_text(errors="replace")
    assert "Jenga pool (sliding window)" in log


def test_gated_deltanet_served_identical_and_resumes_at_the_branch(tmp_path: Path) -> None:
    """Qwen3.5 (in-pass capture of the GDN and conv states): replies identical to stock's,
    turn 2 hits at least what stock hits, the second branch resumes at the branch point, in as
    many prefill rounds as stock's, no chunk cut and no capture lost."""
    (row,) = run_models(("qwen3_5",), tmp_path / "out", tmp_path / "data")
    _check(row, tmp_path / "out", "qwen3_5")
    assert row["cached_tokens_turn2"] >= max(PROMPT, row["stock_cached_tokens_turn2"]), row
    assert row["cached_tokens_branch"] == BRANCH_AT > row["stock_cached_tokens_branch"], row
    assert row["prefill_rounds"] == row["stock_prefill_rounds"], row
    assert row["prefill_cuts"] == row["inpass_captures_lost"] == 0 < row["inpass_captures"], row
