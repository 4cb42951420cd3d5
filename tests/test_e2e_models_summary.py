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


def test_row_carries_prefill_rounds_and_our_counters() -> None:
    cached = {"turn1": 0, "turn2": 239, "branch_a": 0, "branch_b": 150}
    same = {s: [1, 2, i] for i, s in enumerate(STEPS)}
    stock = {**_run({**cached, "branch_b": 0}, same), "prefill_rounds": 4}
    ours = {**_run(cached, same), "prefill_rounds": 5}
    ours["counters"] = {"inpass_captures": 5.0, "inpass_captures_lost": 0.0, "prefill_cuts": 1.0}
    row = family_row("qwen3_5", stock, ours, 1)
    assert (row["prefill_rounds"], row["stock_prefill_rounds"]) == (5, 4)
    assert (row["inpass_captures"], row["inpass_captures_lost"], row["prefill_cuts"]) == (5, 0, 1)
    assert " | 5/4 | 5 / 1 | " in table([row])


def test_counters_sum_our_series_from_the_metrics_text(monkeypatch: Any) -> None:
    import io

    from jenga_sglang.bench.studies import e2e_models

    text = (
        "# HELP jenga:prefill_cuts_total ...\n"
        'jenga:prefill_cuts_total{cache_type="jenga",tp_rank="0"} 2.0\n'
        'jenga:prefill_cuts_total{cache_type="jenga",tp_rank="1"} 1.0\n'
        'jenga:inpass_captures_total{cache_type="jenga",tp_rank="0"} 7.0\n'
        "jenga:inpass_captures_lost_created 1.7e9\n"
    )

    class Reply(io.BytesIO):
        def __enter__(self) -> Reply:
            return self

        def __exit__(self, *exc: object) -> None:
            self.close()

    from jenga_sglang.bench.drivers import server  # its scraper reads /metrics

    monkeypatch.setattr(server.urllib.request, "urlopen", lambda url, timeout: Reply(text.encode()))
    got = e2e_models.counters("http://127.0.0.1:1")
    assert got == {"inpass_captures": 7.0, "inpass_captures_lost": 0.0, "prefill_cuts": 3.0}


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
