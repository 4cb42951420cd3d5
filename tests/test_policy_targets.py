"""The policy-target summary: oracle = best fixed alpha per configuration, figures over configs."""

from __future__ import annotations

import pytest

from jenga_sglang.bench.studies.policy_targets import summary, table


def record(trace: str, gb: float, policy: str, rate: float, violations: int = 0) -> dict:  # type: ignore[type-arg]
    return {
        "trace": trace,
        "cache_gb": gb,
        "policy": policy,
        "token_hit_rate": rate,
        "capacity_violations": violations,
    }


def test_oracle_is_the_best_fixed_alpha_per_configuration():
    records = [
        record("a", 1, "marconi@0.0", 0.2),
        record("a", 1, "marconi@0.5", 0.3),
        record("a", 1, "marconi@1.0", 0.1),
        record("b", 1, "marconi@1.0", 0.4),
    ]
    rates, best = table(records)
    assert rates[("a", 1.0)]["oracle"] == 0.3 and best[("a", 1.0)] == 0.5
    assert rates[("b", 1.0)]["oracle"] == 0.4 and best[("b", 1.0)] == 1.0


def test_summary_counts_configs_where_jenga_loses():
    records = []
    for trace, jenga in (("a", 0.5), ("b", 0.1)):
        records += [
            record(trace, 1, "jenga", jenga),
            record(trace, 1, "marconi", 0.3),
            record(trace, 1, "sglang-lru", 0.2),
            record(trace, 1, "vllm-blocks", 0.1),
            record(trace, 1, "marconi@0.0", 0.25),
        ]
    out = summary(table(records)[0])
    assert out["mean_jenga"] == pytest.approx(0.3)
    assert out["jenga_below_sglang_lru_configs"] == 1
    assert out["marconi_over_vllm_ratio_of_means"] == pytest.approx(3.0)
    assert out["configs"] == 2 and out["incomplete_configs"] == 0


def test_a_capacity_violation_is_an_error():
    with pytest.raises(ValueError, match="capacity"):
        table([record("a", 1, "jenga", 0.1, violations=1)])


def test_a_jenga_only_grid_still_gets_jenga_figures():
    records = [
        record("a", 1, "jenga", 0.3),
        record("a", 1, "sglang-lru", 0.2),
        record("a", 1, "marconi@0.5", 0.25),
    ]
    out = summary(table(records)[0])
    assert out["mean_jenga"] == pytest.approx(0.3)
    assert out["mean_oracle"] == pytest.approx(0.25)
    assert out["jenga_below_sglang_lru_configs"] == 0
    assert "marconi_over_vllm_ratio_of_means" not in out
