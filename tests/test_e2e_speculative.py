"""End to end on CPU: NGRAM speculative decoding over the Jenga pool against stock SGLang.

A small `jenga-bench speculative-cpu` run (bench/studies/speculative_cpu.py): the tiny NemotronH
served with `--speculative-algorithm NGRAM` (chains of 3 drafts) and the Triton attention
backend, stock SGLang (its cache and pools) and `--enable-jenga` (the Jenga pool, the verify
scratch beside it), `no_buffer`. The same token-id requests go one at a time to each: one
session's two turns, a retry of its first prompt (NGRAM's corpus now holds that reply, so its
drafts are accepted), and two requests leaving that prompt at one branch point.

Checked request by request: identical greedy outputs, verify rounds and proposed and accepted
drafts; jenga's cached tokens at least stock's, and on the second branch request the branch
point's state (captured inside the first one's prefill), which stock lacks. About 3 minutes on
2 cores. `make speculative-cpu` runs the larger study, extra_buffer too (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from jenga_sglang.bench.studies.speculative_cpu import run_variant, workload

pytestmark = pytest.mark.sglang

_ARGS = argparse.Namespace(
    sessions=1, turns=2, branches=1, reply_tokens=12, seed=0, no_progress=True
)
_ACCEPTANCE = ("verify_rounds", "proposed", "accepted")


def test_ngram_over_the_jenga_pool_matches_stock_and_hits_more(
    tiny_model: Path, tmp_path: Path
) -> None:
    stock = run_variant(str(tiny_model), "stock", "no_buffer", _ARGS, tmp_path)
    jenga = run_variant(str(tiny_model), "jenga", "no_buffer", _ARGS, tmp_path)
    text = (tmp_path / "jenga-no_buffer.log").read_text(errors="replace")
    assert "impl=JengaRadixCache" in text and "Jenga pool: " in text
    assert [r["kind"] for r in jenga] == ["turn", "turn", "retry", "branch", "branch"]
    assert [r["output"] for r in jenga] == [r["output"] for r in stock]
    for ours, theirs in zip(jenga, stock, strict=True):
        assert [ours[k] for k in _ACCEPTANCE] == [theirs[k] for k in _ACCEPTANCE]
        assert ours["cached"] >= theirs["cached"]
    assert jenga[2]["accepted"] > 0  # the retry's drafts come from the first reply
    first, second = jenga[0], jenga[1]
    assert second["cached"] >= first["prompt"] + len(first["output"]) - 1  # the verified reply
    branch = workload(_ARGS)[-1][1]
    cut = len(branch) - 12  # the branch point: the shared prefix of the two branch requests
    assert jenga[4]["cached"] == cut > stock[4]["cached"]
