"""Every study is a `jenga-bench` subcommand that hands its arguments to the study's own
`main` (bench/cli/studies.py)."""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from jenga_sglang.bench.cli.main import build_parser, main
from jenga_sglang.bench.cli.studies import STUDIES


def test_every_study_module_has_a_main() -> None:
    for module, _ in STUDIES.values():
        study = importlib.import_module(f"jenga_sglang.bench.studies.{module}")
        assert callable(study.main), module


def test_every_study_is_a_subcommand_that_keeps_its_arguments() -> None:
    parser = build_parser()
    for name in STUDIES:
        args = parser.parse_args([name, "--json", "a", "-x"])
        assert args.argv == ["--json", "a", "-x"], name


def test_flags_after_the_subcommand_reach_the_study(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eviction", "--nodes", "200", "--evictions", "20", "--policies", "lru", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["policy"], r["nodes"]) for r in rows] == [("lru", 200)]


def test_the_study_prints_its_own_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["eviction", "--help"])
    assert exit_.value.code == 0
    assert "--evictions" in capsys.readouterr().out


def test_a_bad_flag_is_the_study_s_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["eviction", "--policies", "nope"])
    assert exit_.value.code == 2
    assert "unknown policies" in capsys.readouterr().err


def test_sessions_study_refuses_bad_input_before_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from jenga_sglang.bench.studies.sessions_cpu import main as sessions_main

    assert sessions_main(["--model", str(tmp_path / "none")]) == 2
    assert "no model at" in capsys.readouterr().err
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert sessions_main(["--model", str(model), "--concurrency", "0"]) == 2
    assert "concurrency must be >= 1" in capsys.readouterr().err


def test_sessions_study_compares_replies_on_the_turns_both_servers_served() -> None:
    """With several sessions in flight the request budget ends in whichever session timing
    picks: the servers' request sets may differ, and only common turns are compared."""
    from jenga_sglang.bench.studies.sessions_cpu import Turn, same_replies

    def turns(texts: dict[tuple[int, int], str]) -> dict[tuple[int, int], Turn]:
        return {k: Turn(t) for k, t in texts.items()}

    first = turns({(0, 0): "a", (0, 1): "b", (1, 0): "c"})
    assert same_replies(first, turns({(0, 0): "a", (0, 1): "b", (2, 0): "d"})) == "2/2"
    assert same_replies(first, turns({(0, 0): "a", (0, 1): "x", (1, 0): "c"})) == "2/3"
    assert same_replies(first, first) == "3/3"


def test_sessions_study_compares_hits_and_ttft_on_the_same_turns() -> None:
    """A server that refused a turn ended that session there; the other served it and the
    session's longer next turns. Totals then cover different prompts, so cached ratio and
    TTFT are also compared over the turns both served with equal prompts only."""
    from jenga_sglang.bench.studies.sessions_cpu import Turn, on_common_turns

    first = {(0, 0): Turn("a", 100, 0, 1.0), (0, 1): Turn("b", 200, 100, 2.0)}
    other = {
        (0, 0): Turn("a", 100, 50, 0.5),
        (0, 1): Turn("b", 200, 150, 1.0),
        (0, 2): Turn("c", 900, 800, 9.0),  # served by this one only
        (1, 0): Turn("d", 50, 0, 3.0),
    }
    first[(1, 0)] = Turn("d", 60, 0, 3.0)  # not the same prompt: left out
    assert on_common_turns(first, other) == {
        "turns": 2,
        "first_cached_ratio": 100 / 300,
        "first_mean_ttft_s": 1.5,
        "this_cached_ratio": 200 / 300,
        "this_mean_ttft_s": 0.75,
    }


def test_scale_dp_compares_runs_on_the_requests_both_served() -> None:
    """Each later run against the first over the requests both served with equal prompts
    (the router's client sends whichever session is ready, so the sets differ), and replies
    compared per router policy on the requests every variant sent."""
    from jenga_sglang.bench.studies.scale_dp import common_requests, identical_replies
    from jenga_sglang.bench.studies.sessions_cpu import Turn

    def run(variant: str, turns: dict[str, Turn]) -> dict[str, Any]:
        return {"variant": variant, "policy": "cache_aware", "chat": {"turns": turns}}

    stock = run("stock", {"0/0": Turn("a", 100, 0, 2.0), "0/1": Turn("b", 300, 100, 4.0)})
    jenga = run(
        "jenga",
        {
            "0/0": Turn("a", 100, 0, 1.0),
            "0/1": Turn("c", 300, 200, 1.0),  # another reply, the same prompt length
            "1/0": Turn("d", 80, 0, 9.0),  # sent by this run only
        },
    )
    common = common_requests([stock, jenga], ["chat"])
    assert common == {
        "chat": {
            "jenga-cache_aware": {
                "turns": 2,
                "first_cached_ratio": 100 / 400,
                "first_mean_ttft_s": 3.0,
                "this_cached_ratio": 200 / 400,
                "this_mean_ttft_s": 1.0,
            }
        }
    }
    assert common_requests([stock], ["chat"]) == {}
    assert identical_replies([stock, jenga], ["chat"]) == {"cache_aware/chat": [2, 1]}


def test_sessions_study_reports_each_servers_replies_against_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run_study` compares every server's replies with the first variant's and leaves the
    replies themselves out of the summary (servers stood in for: this checks the wiring)."""
    from jenga_sglang.bench.studies import sessions_cpu
    from jenga_sglang.bench.studies.online import OnlineConfig
    from jenga_sglang.bench.studies.sessions_cpu import Turn

    first = {(0, 0): Turn("x", 10, 0, 1.0), (0, 1): Turn("y", 20, 10, 1.0)}
    served = iter([({"cached_tokens": 1}, first), ({"cached_tokens": 2}, {(0, 0): Turn("z", 10)})])
    monkeypatch.setattr(sessions_cpu, "serve_sessions", lambda *_a, **_k: next(served))
    monkeypatch.setattr(sessions_cpu, "small_agent_trace", lambda *_a: tmp_path / "trace")
    config = OnlineConfig(url="http://127.0.0.1:1")
    summary = sessions_cpu.run_study(
        "m", tmp_path, config, 8, 1024, variants=("jenga-host", "jenga")
    )
    assert summary["jenga-host"] == {"cached_tokens": 1, "same_replies_as_jenga-host": "2/2"}
    assert summary["jenga"] == {
        "cached_tokens": 2,
        "same_replies_as_jenga-host": "0/1",
        "common_turns_with_jenga-host": {
            "turns": 1,
            "first_cached_ratio": 0.0,
            "first_mean_ttft_s": 1.0,
            "this_cached_ratio": 0.0,
            "this_mean_ttft_s": 0.0,
        },
    }
    kept = json.loads((tmp_path / "replies-jenga-host.json").read_text())
    # by (session, turn) with what each turn measured, to trace a difference
    assert kept == [[0, 0, "x", 10, 0, 1.0], [0, 1, "y", 20, 10, 1.0]]
    assert json.loads((tmp_path / "replies-jenga.json").read_text()) == [[0, 0, "z", 10, 0, 0.0]]


def test_reply_trace_rebuilds_the_prompt_a_session_turn_sent(tmp_path: Path) -> None:
    """The history of (session, turn): the trace's user texts in order, each earlier turn
    followed by the first server's reply to it, and the turn's own reply length."""
    from jenga_sglang.bench.studies.e2e_cpu import small_agent_trace
    from jenga_sglang.bench.studies.reply_trace import rebuild_prompt
    from jenga_sglang.bench.traces.turns import OnlineConfig, sessions_from_trace

    trace = small_agent_trace(tmp_path / "traces", 2)
    client = {"max_user_words": 40, "max_output_tokens": 8}
    (tmp_path / "summary.json").write_text(json.dumps({"trace": str(trace), "client": client}))
    config = OnlineConfig(url="http://127.0.0.1", **client)
    session = sessions_from_trace(str(trace), config)[1]
    sid = session[0].session_id
    replies = [[sid, t, f"reply {t}"] for t in range(len(session))]
    (tmp_path / "replies-stock.json").write_text(json.dumps(replies))
    messages, reply_len = rebuild_prompt(tmp_path, sid, 2, "stock")
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2 + ["user"]
    assert [m["content"] for m in messages[0::2]] == [t.user_text for t in session[:3]]
    assert [m["content"] for m in messages[1::2]] == ["reply 0", "reply 1"]
    assert reply_len == session[2].max_tokens


def test_reply_trace_finds_where_decode_and_prefill_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage 3 scores the cold reply by decode and by one prefill of prompt + reply, and names
    the first reply token whose two log-probabilities differ. The fake server's decode reads a
    different context once it reaches 32 tokens, as SGLang's triton sliding-window decode does."""
    from jenga_sglang.bench.drivers import faults
    from jenga_sglang.bench.studies import reply_trace

    def score(context: int, decode: bool) -> float:
        return -1.0 - context * 1e-3 - (0.01 if decode and context >= 32 else 0.0)

    def generate(url: str, ids: list[int], n: int, **kw: Any) -> tuple[int, dict[str, Any]]:
        start = kw.get("logprob_start_len")
        reply = [(len(ids) + k) % 7 for k in range(n)]
        out = [(score(len(ids) + k, True), t) for k, t in enumerate(reply)]
        meta: dict[str, Any] = {"output_token_logprobs": out}
        meta["output_top_logprobs"] = [[(lp, t), (lp - 0.5, t + 1)] for lp, t in out]
        if start is not None:  # only the prompt's tokens from `start` are scored
            meta["input_token_logprobs"] = [
                (score(p, False), ids[p]) for p in range(start, len(ids))
            ]
        return 200, {"meta_info": meta}

    monkeypatch.setattr(faults, "generate", generate)
    monkeypatch.setattr(faults, "flush_cache", lambda url, timeout_s=0.0: None)
    ids = list(range(100, 140))
    checks = reply_trace.decode_against_prefill("http://127.0.0.1:1", ids, 8, [10, 28])
    assert checks[10]["first_divergent_token"] is None  # 10 + 8 tokens stay under 32
    assert checks[10]["largest_difference"] < 1e-9
    assert checks[28]["first_divergent_token"] == 4
    assert checks[28]["context_there"] == 32
    assert checks[28]["largest_difference"] == pytest.approx(0.01)


def test_metric_samples_sum_over_ranks_and_select_one_label() -> None:
    """`sum_samples` (what `scrape_counters` reads off /metrics) sums a counter over its label
    sets, and a name with a label selector counts only the samples with that label value."""
    from jenga_sglang.bench.drivers.server import sum_samples

    text = "\n".join(
        [
            "# TYPE sglang:cached_tokens_total counter",
            'sglang:cached_tokens_total{cache_source="device",tp_rank="0"} 40.0',
            'sglang:cached_tokens_total{cache_source="host",tp_rank="0"} 7.0',
            'sglang:cached_tokens_total{cache_source="host",tp_rank="1"} 5.0',
            'sglang:cached_tokens_total{cache_source="total",tp_rank="0"} 47.0',
            'jenga:host_hit_tokens_total{tp_rank="0"} 3.0',
            "jenga:host_hit_tokens_total_other 100.0",
        ]
    )
    names = {
        "host": 'sglang:cached_tokens_total{cache_source="host"}',
        "all": "sglang:cached_tokens_total",
        "ours": "jenga:host_hit_tokens_total",
        "absent": "jenga:nothing_total",
    }
    assert sum_samples(text, names) == {"host": 12.0, "all": 99.0, "ours": 3.0, "absent": 0.0}


@contextmanager
def _loopback(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """An HTTP server on a free loopback port answering with `handler`; yields its URL and is
    shut down, its thread joined (bounded), on the way out."""
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_flush_cache_retries_while_sglang_says_busy() -> None:
    """SGLang answers /flush_cache with 400 while a request is still in its batch, which can
    outlast the request's reply by a step: the client retries a 400, a bounded number of
    times, and raises on anything else. A loopback server answers 400 twice, then 200."""
    from jenga_sglang.bench.drivers import faults

    answers = [400, 400, 200, 500]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(answers.pop(0))
            self.end_headers()
            self.wfile.write(b"busy")

        def log_message(self, *args: Any) -> None:
            pass

    with _loopback(Handler) as url:
        faults.flush_cache(url, timeout_s=5)
        assert answers == [500]  # three posts: two refused, the third flushed
        with pytest.raises(RuntimeError, match="HTTP 500"):
            faults.flush_cache(url, timeout_s=5)
        answers.extend([400, 400])
        with pytest.raises(RuntimeError, match="HTTP 400"):
            faults.flush_cache(url, timeout_s=5, tries=2)


def test_the_router_is_ready_once_every_worker_is() -> None:
    """smg answers as soon as its first worker is registered; a run's first requests would
    then all go to that one. LocalRouter waits for every worker listed healthy and ready (a
    loopback server answers /workers as smg 1.13 does, with one worker, then two)."""
    from jenga_sglang.bench.drivers.router import LocalRouter

    listed: list[dict[str, Any]] = [{"url": "grpc://a", "is_healthy": True, "status": "ready"}]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"workers": listed}).encode()
            self.send_response(200 if self.path == "/workers" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with _loopback(Handler) as url:
        router = LocalRouter(["grpc://a", "grpc://b"], "cache_aware", model="m", log=Path("x"))
        router.url = url  # never started
        assert not router._ready()
        listed.append({"url": "grpc://b", "is_healthy": False, "status": "pending"})
        assert not router._ready()
        listed[1].update(is_healthy=True, status="ready")
        assert router._ready()


def test_pd_cpu_tp_gives_every_server_its_ranks() -> None:
    """Its servers take their ports from free_port as every server does (checked in
    tests/test_loopback_process.py)."""
    import os
    from argparse import Namespace

    from jenga_sglang.bench.studies import pd_cpu

    flags, env = pd_cpu._parallel(Namespace(tp=2))
    cores = os.cpu_count() or 1
    assert flags == ("--tp-size", "2")
    assert env == {"SGLANG_CPU_OMP_THREADS_BIND": f"0|{1 % cores}"}
    assert pd_cpu._parallel(Namespace(tp=1)) == ((), {})  # SGLang's defaults
    assert pd_cpu._parallel(Namespace()) == ((), {})  # callers without the option
    with pytest.raises(SystemExit):
        pd_cpu.main(["--tp", "0"])
