"""bench/studies/e2e_models.py without a server: the session's prompts and the summary rows."""

from __future__ import annotations

from typing import Any

from jenga_sglang.bench.studies.e2e_models import (
    BRANCH_AT,
    PROMPT,
    STEPS,
    family_row,
    session_prompts,
    strategy_for,
    table,
)

KEYS = {
    "arch",
    "served",
    "identical_outputs",
    "cached_tokens_turn2",
    "cached_tokens_branch",
    "stock_cached_tokens_turn2",
    "stock_cached_tokens_branch",
    "page_size",
}


def _run(
    cached: dict[str, int], outputs: dict[str, list[int]], shift: float = 0.0
) -> dict[str, Any]:
    steps = {
        s: {
            "cached_tokens": cached[s],
            "output_ids": outputs[s],
            "logprobs": [-1.0 - shift * (s == "branch_b") for _ in outputs[s]],
        }
        for s in STEPS
    }
    return {"served": True, "steps": steps}


def test_prompts_share_the_head_and_branch_at_the_branch_point() -> None:
    p = session_prompts(0)
    assert len(p["turn1"]) == PROMPT and p == session_prompts(0)
    assert p["branch_a"][:BRANCH_AT] == p["branch_b"][:BRANCH_AT] == p["turn1"][:BRANCH_AT]
    assert p["branch_a"] != p["branch_b"]
    assert p["branch_a"][BRANCH_AT:] != p["turn1"][BRANCH_AT : len(p["branch_a"])]
    assert min(min(v) for v in p.values()) >= 6  # no special token ids


def test_row_has_the_issue_fields_and_compares_every_step() -> None:
    cached = {"turn1": 0, "turn2": 207, "branch_a": 0, "branch_b": 150}
    same = {s: [1, 2, i] for i, s in enumerate(STEPS)}
    stock = _run({**cached, "branch_b": 0}, same)
    row = family_row("falcon_h1", stock, _run(cached, same), 1)
    assert set(row) >= KEYS and row["arch"] == "FalconH1ForCausalLM"
    assert row["identical_outputs"] and row["served"]
    assert (row["cached_tokens_branch"], row["stock_cached_tokens_branch"]) == (150, 0)
    differ = {**same, "branch_a": [9]}
    assert not family_row("falcon_h1", stock, _run(cached, differ), 1)["identical_outputs"]
    refused = {"served": False, "error": "UnsupportedModelError: ... GptOssForCausalLM ..."}
    row = family_row("gpt_oss", stock, refused, 1)
    assert not row["served"] and row["identical_outputs"] is None
    assert row["cached_tokens_turn2"] is None and "GptOss" in row["jenga_error"]
    assert "GptOssForCausalLM" in table([row])


def test_row_reports_the_largest_logprob_difference() -> None:
    cached = {"turn1": 0, "turn2": 239, "branch_a": 0, "branch_b": 150}
    same = {s: [1, 2, i] for i, s in enumerate(STEPS)}
    row = family_row("falcon_h1", _run(cached, same), _run(cached, same, shift=0.25), 1)
    assert row["identical_outputs"] and row["max_logprob_diff"] == 0.25


def test_state_families_run_extra_buffer_above_page_one() -> None:
    assert strategy_for("nemotron_h", 16) == "extra_buffer"
    assert strategy_for("qwen3_5", 64) == "extra_buffer"
    assert strategy_for("nemotron_h", 1) == "no_buffer"
    assert strategy_for("gpt_oss", 16) == strategy_for("llama", 64) == "no_buffer"
