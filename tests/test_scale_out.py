"""Scale-out of `--enable-jenga` on CPU, live (loopback, every wait bounded, servers stopped by
their process group). The full comparisons with stock SGLang are `jenga-bench scale-tp` and
`scale-dp` (bench/RESULTS.md, "Scale-out"); these are their CI subsets:

* TP: the tiny model at `--tp-size 2` (two scheduler ranks, one core each, pynccl off by the
  CPU test shim) with SGLang's rank-consensus checker on: multi-turn sessions and a cancelled
  stream; the checker stays quiet (a divergence would end the schedulers), both ranks built
  the same Jenga pool, and a turn hits the previous turn's prompt and reply. About 2 minutes.
* DP: two jenga workers in gRPC mode publishing KV events, smg's event-driven `cache_aware`
  router in front; two agent sessions through the router's URL. Later turns hit, the router
  places them from the workers' events, and its predicted hit tokens are within 10% of what
  the workers report as cached. About 2 minutes.
* Events of a sliding-window worker (the tiny gpt-oss; smg cannot front it offline, so a
  model of its block index reads them, bench/drivers/kv_index.py): next turns predicted
  exactly, nothing predicted past a hit. About a minute.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from jenga_sglang.bench.drivers.faults import generate, stream_generate, unexpected_tracebacks
from jenga_sglang.bench.drivers.server import LocalServer
from jenga_sglang.bench.studies import scale_dp, scale_tp

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


def test_tp2_jenga_keeps_the_consensus_checker_quiet(tiny_model: Path, tmp_path: Path) -> None:
    log = tmp_path / "tp2.log"
    flags = ("--tp-size", "2", "--enable-jenga", "--max-running-requests", "4")
    with LocalServer(str(tiny_model), flags, log=log, env=scale_tp.TP_ENV) as server:
        cancelled = stream_generate(server.url, scale_tp._head(9), 40, cancel_after=2)
        assert cancelled.cancelled
        with ThreadPoolExecutor(2) as pool:
            sessions = list(pool.map(lambda s: _two_turns(server.url, s), (0, 1)))
        status, _ = generate(server.url, scale_tp._head(5), 2)
        assert status == 200
    facts = scale_tp.read_log(log.read_text(errors="replace"))
    assert facts["checker_on"] and facts["divergences"] == 0
    assert set(facts["pool_lines"]) == {"0", "1"} and facts["pools_equal"]
    assert facts["tracebacks"] == 0 and facts["leaks"] == 0
    for first_prompt, second_cached in sessions:
        # the prompt and the reply, but its last token: SGLang never computes its KV
        assert second_cached >= first_prompt + 3


def _two_turns(url: str, session: int) -> tuple[int, int]:
    prompt = scale_tp._head(session)
    status, body = generate(url, prompt, 4, timeout_s=300)
    assert status == 200, body
    second = [*prompt, *body["output_ids"], 401, 402]
    status, body = generate(url, second, 4, timeout_s=300)
    assert status == 200, body
    return len(prompt), int(body["meta_info"]["cached_tokens"])


def test_router_predicts_the_jenga_workers_hits(tiny_model: Path, tmp_path: Path) -> None:
    router = _routed_agent_load(tiny_model, tmp_path)
    said, got = router["predicted_tokens"], router["reported_cached_tokens"]
    assert abs(said - got) <= 0.1 * got, router


def test_a_window_models_events_predict_its_hits(tiny_window_model: Path, tmp_path: Path) -> None:
    """A sliding-window worker's events (spans end at node ends whose window the tree
    holds, binding/slots/kv_events.py) read into a model of smg's block index: a next turn
    is predicted exactly, and nothing is ever predicted past the hit."""
    from argparse import Namespace

    from jenga_sglang.bench.studies import window_events

    args = Namespace(
        sessions=1,
        turns=3,
        branches=1,
        revisits=0,
        reply_tokens=8,
        seed=0,
        no_progress=True,
        server_flags="",
    )
    result = window_events.run_variant(str(tiny_window_model), "jenga", args, tmp_path)
    turns = [r for r in result["requests_detail"] if r["kind"] == "turn"]
    assert all(r["cached"] > 0 and r["predicted"] == r["cached"] for r in turns[1:]), turns
    assert result["over_predicted_tokens"] == 0, result
    assert unexpected_tracebacks((tmp_path / "jenga.log").read_text(errors="replace")) == 0


def _routed_agent_load(model: Path, tmp_path: Path) -> dict[str, Any]:
    """Two jenga workers of `model` behind smg's cache-aware router, two agent sessions;
    checks the load and the workers' logs, and returns the router's figures."""
    from jenga_sglang.bench.traces.agent import AgentParams
    from jenga_sglang.bench.traces.build import cached_trace

    trace = cached_trace("agent", AgentParams(sessions=2, seed=0), tmp_path / "traces")
    traces = {"agent": trace}
    config = scale_dp.client_config(max_requests=6, max_seconds=300)
    spill = ("--balance-abs-threshold", "1", "--balance-rel-threshold", "1.2")  # a small fleet's
    result = scale_dp.run_one(
        str(model), "jenga", "cache_aware", traces, config, tmp_path, router_flags=spill
    )
    assert result["router_flags"] == list(spill)  # smg refuses a flag it lacks at start-up
    agent = result["agent"]
    assert agent["requests"] == 6 and agent["errors"] == 0
    assert agent["cached_tokens"] > 0
    router: dict[str, Any] = agent["router"]
    assert router["event_routed"] >= 3  # turns after the first events placed by the events
    for name in ("jenga-cache_aware-w0.log", "jenga-cache_aware-w1.log"):
        assert unexpected_tracebacks((tmp_path / name).read_text(errors="replace")) == 0
    return router
