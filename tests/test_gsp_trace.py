"""`jenga-bench traces build gsp`: SGLang's generated-shared-prefix generator, offline, as a trace.

Imports sglang (its benchmark datasets pull transformers): about a minute on 2 shared cores.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from jenga_sglang.bench.cli.traces import main as traces_main
from jenga_sglang.bench.traces.gsp import GSPParams, gsp_trace
from jenga_sglang.bench.traces.trace import load_trace_with_meta

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

SMALL = dict(groups=4, prompts_per_group=6, system_prompt_len=40, question_len=6, output_len=3)


def _system_prompts(inputs: list[list[int]], length: int) -> Counter[tuple[int, ...]]:
    return Counter(tuple(x[:length]) for x in inputs)


def test_uniform_groups_share_their_system_prompt_only() -> None:
    reqs, meta = gsp_trace(GSPParams(**SMALL, popularity="uniform"))  # type: ignore[arg-type]
    assert len(reqs) == 24 and meta["requests_per_group"] == [6, 6, 6, 6]
    assert all(r.num_input_tokens == 46 and r.num_output_tokens == 3 for r in reqs)
    heads = _system_prompts([r.input_tokens for r in reqs], 40)
    assert sorted(heads.values()) == [6, 6, 6, 6]
    # questions are drawn per request: no two requests share more than their system prompt
    assert len({tuple(r.input_tokens) for r in reqs}) == 24
    assert [r.session_id for r in reqs] == sorted({r.session_id for r in reqs})
    ts = [r.ts for r in reqs]
    assert ts == sorted(ts) and ts[0] == 0.0 and ts[-1] > 0
    # shuffled: the groups do not arrive in blocks
    order = [tuple(r.input_tokens[:40]) for r in reqs]
    assert order != sorted(order, key=order.index)


def test_zipf_popularity_skews_towards_the_first_group_and_is_seeded() -> None:
    params = GSPParams(
        **{**SMALL, "groups": 8, "prompts_per_group": 25}, popularity="zipf", zipf_alpha=1.5
    )  # type: ignore[arg-type]
    state = random.getstate(), np.random.get_state()[1].tolist()
    reqs, meta = gsp_trace(params)
    assert (random.getstate(), np.random.get_state()[1].tolist()) == state  # globals restored
    sizes = meta["requests_per_group"]
    assert sum(sizes) == 200 and sizes[0] == max(sizes) and sizes[0] > 2 * sizes[-1]
    again, _ = gsp_trace(params)
    assert [r.input_tokens for r in again] == [r.input_tokens for r in reqs]
    other, _ = gsp_trace(
        GSPParams(
            **{**SMALL, "groups": 8, "prompts_per_group": 25},
            popularity="zipf",
            zipf_alpha=1.5,
            seed=7,
        )
    )  # type: ignore[arg-type]
    assert [r.input_tokens for r in other] != [r.input_tokens for r in reqs]


def test_cli_builds_and_caches_gsp(tmp_path: Path) -> None:
    args = ["traces", "build", "gsp", "--cache-dir", str(tmp_path), "--groups", "2",
            "--prompts-per-group", "2", "--system-prompt-len", "20", "--question-len", "4",
            "--output-len", "2", "--popularity", "zipf"]  # fmt: skip
    assert traces_main(args) == 0
    (path,) = tmp_path.glob("gsp-*.jsonl.gz")
    reqs, meta = load_trace_with_meta(path)
    assert len(reqs) == 4 and meta["kind"] == "gsp" and meta["params"]["popularity"] == "zipf"
    mtime = path.stat().st_mtime_ns
    assert traces_main(args) == 0 and path.stat().st_mtime_ns == mtime  # reused
    assert traces_main([*args[:-1], "pareto"]) == 2
