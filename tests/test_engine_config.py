"""The engine's configuration fields and its observer, on the tiny scenarios of test_engine.py.

The defaults are the engine replay's; the other values are the fragmentation study's rules
(bench/studies/frag_timeline.py `study_config`), each checked on its own here.
"""

from __future__ import annotations

import json

import pytest

from jenga_sglang.bench.simulation.engine import EngineConfig, EngineObserver, replay_engine
from jenga_sglang.bench.simulation.engine_batch import Running, reserve_tokens
from jenga_sglang.bench.simulation.engine_cache import EngineCache
from jenga_sglang.bench.traces.packed import pack
from jenga_sglang.bench.traces.trace import Request
from jenga_sglang.radix.pages import PageType
from tests.test_engine import COST, KV, STATE, cache_of, two_strangers


class Counting(EngineObserver):
    def __init__(self) -> None:
        self.admissions, self.steps = 0, 0
        self.failures: list[tuple[tuple[PageType, ...], int]] = []

    def admitted(self, engine: EngineCache, run: Running) -> None:
        self.admissions += 1

    def allocation_failed(
        self, engine: EngineCache, ptypes: tuple[PageType, ...], count: int
    ) -> None:
        self.failures.append((ptypes, count))

    def stepped(self, engine: EngineCache, decode_batch: int, prefill_tokens: int) -> None:
        self.steps += 1


@pytest.mark.parametrize(
    "field, value",
    [
        ("chunk_budget", "none"),
        ("preemption", "swap"),
        ("reserve", "bytes"),
        ("step_order", "random"),
        ("admission_rule", "always"),
        ("decode_reserve_fraction", 1.5),
    ],
)
def test_config_rejects_unknown_rules(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value})  # type: ignore[arg-type]


def test_reserve_in_tokens_or_as_a_fraction_of_the_remaining_output() -> None:
    (req,) = pack([Request(0, 0, 0.0, list(range(10)), list(range(100, 109)))])
    fresh = Running(0, req, 0)
    tokens = EngineConfig(decode_reserve_tokens=4)
    fraction = EngineConfig(reserve="fraction", decode_reserve_fraction=0.5)
    assert reserve_tokens(fresh, tokens, retracted=False) == 10 + 4
    assert reserve_tokens(fresh, tokens, retracted=True) == 10 + 9  # its whole output
    assert reserve_tokens(fresh, fraction, retracted=False) == 10 + 5  # 4.5 rounds up
    back = Running(0, req, 0, decoded=3)  # re-prefills 3 more tokens
    assert back.target == 13
    assert reserve_tokens(back, fraction, retracted=True) == 13 + 3


@pytest.mark.parametrize("preemption, prefilled", [("restart", 30), ("reprefill", 32)])
def test_a_pushed_out_request_restarts_or_reprefills_what_it_decoded(
    preemption: str, prefilled: int
) -> None:
    """test_engine's retraction: r2 is pushed out in step 3 having decoded 2 tokens. Restarted
    it prefills its 10 input tokens again; re-prefilled, those plus its 2 output tokens."""
    cache = cache_of(25 * KV + 2 * STATE)
    config = EngineConfig(decode_reserve_tokens=0, preemption=preemption)  # type: ignore[arg-type]
    seen = Counting()
    stats = replay_engine(two_strangers(out=10), cache, None, COST, config, True, seen)
    assert stats.retractions == 1 and stats.requests == 2 and stats.output_tokens == 20
    assert sum(row[2] for row in stats.timeline) == prefilled
    assert seen.admissions == 3 and seen.steps == stats.steps
    assert seen.failures == [(cache.tree.kv_types, 1)]  # r2's decode token


def test_per_request_chunks_in_admission_order() -> None:
    """Chunks of 4 tokens: shared, the two 10-token prompts take 5 steps of 4 tokens; one chunk
    each, 3 steps of 8, 8 and 4. In order, the first token comes the step after the prefill
    and both requests decode in step 4."""
    requests = two_strangers(out=4)
    shared = replay_engine(requests, cache_of(10**9), None, COST, EngineConfig(chunk_tokens=4))
    assert [row[2] for row in shared.timeline[:5]] == [4, 4, 4, 4, 4]
    config = EngineConfig(chunk_tokens=4, chunk_budget="per-request", step_order="in-order")
    stats = replay_engine(requests, cache_of(10**9), None, COST, config)
    assert [row[2] for row in stats.timeline[:4]] == [8, 8, 4, 0]
    assert [row[1] for row in stats.timeline] == [0, 0, 0, 2, 2, 2, 2]
    assert stats.requests == 2 and stats.steps == 7


def test_the_fragmentation_study_runs_under_either_rules(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The study's own rules and the engine replays' give different schedules on one workload
    (per-request chunks take fewer steps), every request finishing under both."""
    from jenga_sglang.bench.studies.fragmentation import main

    argv = ["--requests", "6", "--min-tokens", "3000", "--max-tokens", "9000"]
    argv += ["--decode-tokens", "200", "--chunk-tokens", "1024", "--jobs", "1", "--json"]
    steps = {}
    for rules in ("study", "replay"):
        assert main([*argv, "--engine-rules", rules]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["engine_rules"] == rules
        for r in report["results"]:
            assert r["finished"] == 6 and r["admissions"] == 6 + r["preemptions"]
        steps[rules] = [r["steps"] for r in report["results"]]
    assert all(s < r for s, r in zip(steps["study"], steps["replay"], strict=True))
