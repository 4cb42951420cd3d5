"""End to end on CPU: speculative decoding over the Jenga pool against stock SGLang.

Small `jenga-bench speculative-cpu` runs (bench/studies/speculative_cpu.py) with the Triton
attention backend, stock SGLang (its cache and pools) against `--enable-jenga` (the Jenga pool:
the verify scratch beside it, and a draft model's KV in the target's KV rows), `no_buffer`:
NGRAM (chains of 3 drafts) on the tiny NemotronH, and STANDALONE, NEXTN (the model's own MTP
layer) and EAGLE (chains of 3; in `make test-full`: it takes NEXTN's path, a draft head on the
target's hidden states) on scripts/make_tiny_spec.py's models, whose drafts propose the
target's next token often. The same token-id requests go one at a time to each: one session's
two turns, a retry of its first prompt (NGRAM's corpus now holds that reply, so its drafts are
accepted), and two requests leaving that prompt at one branch point.

Checked request by request: identical greedy outputs, verify rounds and proposed and accepted
drafts (a draft reading wrong KV would propose other tokens); jenga's cached tokens at least
stock's, and on the second branch request the branch point's state (captured inside the first
one's prefill), which stock lacks. About 3 minutes per algorithm on 2 cores. `make
speculative-cpu` runs the larger study, extra_buffer too (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from jenga_sglang.bench.studies.speculative_cpu import run_variant, workload

pytestmark = pytest.mark.sglang

_ACCEPTANCE = ("verify_rounds", "proposed", "accepted")


def _args(algorithm: str, draft: Path | None = None) -> argparse.Namespace:
    return argparse.Namespace(
        algorithm=algorithm, draft_model=str(draft), server_flags="", sessions=1, turns=2,
        branches=1, reply_tokens=12, seed=0, no_progress=True,
    )  # fmt: skip


def test_ngram_over_the_jenga_pool_matches_stock_and_hits_more(
    tiny_model: Path, tmp_path: Path
) -> None:
    args = _args("ngram")
    jenga = _check_against_stock(tiny_model, args, tmp_path)
    assert jenga[2]["accepted"] > 0  # the retry's drafts come from the first reply


@pytest.mark.parametrize(
    ("algorithm", "model", "draft"),
    [
        ("standalone", "target", "draft"),
        ("nextn", "mtp", None),  # the model's own MTP layer
        pytest.param("eagle", "target", "eagle", marks=pytest.mark.full),  # NEXTN's path
    ],
)
def test_a_draft_models_kv_in_the_jenga_pool_matches_stock_and_hits_more(
    tiny_spec: Path, tmp_path: Path, algorithm: str, model: str, draft: str | None
) -> None:
    """The draft's KV lives in the target's KV rows; its proposals, and so the acceptance
    compared with stock's, depend on reading it right (the pairs agree often)."""
    args = _args(algorithm, tiny_spec / draft if draft else None)
    jenga = _check_against_stock(tiny_spec / model, args, tmp_path)
    rounds = sum(r["verify_rounds"] for r in jenga)
    assert sum(r["accepted"] for r in jenga) * 8 > rounds  # drafts accepted, and not rarely
    text = (tmp_path / f"{algorithm}-jenga-no_buffer.log").read_text(errors="replace")
    layers = 1  # one KV row: the target's attention layer and the draft's, K and V of 2 x 16
    assert "KV page 512 B" in text
    assert f"the draft model's {layers} KV layers in the target's KV rows" in text


def _check_against_stock(
    model: Path, args: argparse.Namespace, tmp_path: Path
) -> list[dict[str, Any]]:
    stock = run_variant(str(model), "stock", "no_buffer", args, tmp_path)
    jenga = run_variant(str(model), "jenga", "no_buffer", args, tmp_path)
    text = (tmp_path / f"{args.algorithm}-jenga-no_buffer.log").read_text(errors="replace")
    assert "impl=JengaRadixCache" in text and "Jenga pool: " in text
    assert [r["kind"] for r in jenga] == ["turn", "turn", "retry", "branch", "branch"]
    assert [r["output"] for r in jenga] == [r["output"] for r in stock]
    for ours, theirs in zip(jenga, stock, strict=True):
        assert [ours[k] for k in _ACCEPTANCE] == [theirs[k] for k in _ACCEPTANCE]
        assert ours["cached"] >= theirs["cached"]
    first, second = jenga[0], jenga[1]
    assert second["cached"] >= first["prompt"] + len(first["output"]) - 1  # the verified reply
    branch = workload(args)[-1][1]
    cut = len(branch) - 12  # the branch point: the shared prefix of the two branch requests
    assert jenga[4]["cached"] == cut > stock[4]["cached"]
    return jenga
