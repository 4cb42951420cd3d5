"""The packed-trace cache (bench/traces/trace_cache.py): same requests as parsing, a rewritten trace
is parsed again, and a cache file is never trusted to run code."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from jenga_sglang.bench.runs import runner
from jenga_sglang.bench.traces import trace_cache
from jenga_sglang.bench.traces.packed import pack
from jenga_sglang.bench.traces.trace import load_trace


def _write(path: Path, turns: int, first_token: int = 1) -> None:
    rows = [
        {
            "session_id": 0,
            "turn_id": t,
            "ts": float(t),
            "num_input_tokens": 3,
            "num_output_tokens": 2,
            "input_tokens": [first_token, 2, 3 + t],
            "output_tokens": [7, 8],
        }
        for t in range(turns)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _no_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: str) -> None:
        raise AssertionError(f"parsed {path} although it was cached")

    monkeypatch.setattr(runner, "load_trace", refuse)


def test_a_second_load_reads_the_cache_and_gets_the_same_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "t.jsonl"
    _write(trace, 4)
    first = runner._load_fresh(str(trace))
    assert first == pack(load_trace(str(trace)))
    assert trace_cache.cache_path(trace).is_file()
    _no_parsing(monkeypatch)
    assert runner._load_fresh(str(trace)) == first


def test_a_rewritten_trace_is_parsed_again_and_replaces_its_entry(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    _write(trace, 4)
    old = trace_cache.cache_path(trace)
    runner._load_fresh(str(trace))
    _write(trace, 4, first_token=5)  # same size, written straight after
    fresh = runner._load_fresh(str(trace))
    assert fresh[0].inp.tolist() == [5, 2, 3]
    assert not old.exists() and trace_cache.cache_path(trace).is_file()


def test_a_cache_file_naming_a_global_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    _write(trace, 2)
    planted = trace_cache.cache_path(trace)
    planted.parent.mkdir()
    planted.write_bytes(pickle.dumps([(0, 0, 0.0, os.getcwd, b"")]))  # a global, not a value
    assert trace_cache.load(trace) is None
    assert runner._load_fresh(str(trace)) == pack(load_trace(str(trace)))


def test_the_cache_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JENGA_TRACE_CACHE", "0")
    trace = tmp_path / "t.jsonl"
    _write(trace, 2)
    runner._load_fresh(str(trace))
    assert not (tmp_path / ".packed").exists()


def test_preload_reads_cached_traces_itself_and_parses_the_rest_in_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = [tmp_path / f"{name}.jsonl" for name in ("cached", "fresh", "other")]
    for i, path in enumerate(paths):
        _write(path, 2 + i, first_token=1 + i)
    runner._load_fresh(str(paths[0]))
    monkeypatch.setattr(runner, "_TRACES", {})
    handed_to_workers: list[list[str]] = []

    class Pool:  # records what goes to the workers, runs it here
        def __init__(self, jobs: int) -> None: ...

        def __enter__(self) -> Pool:
            return self

        def __exit__(self, *exc: object) -> None: ...

        def imap(self, fn, todo):  # type: ignore[no-untyped-def]
            handed_to_workers.append(list(todo))
            return map(fn, todo)

    monkeypatch.setattr(runner.mp, "get_context", lambda method: type("Ctx", (), {"Pool": Pool}))
    runner.preload([str(p) for p in (*paths, paths[0])], jobs=2)
    assert handed_to_workers == [[str(paths[1]), str(paths[2])]]
    for path in paths:
        assert runner.load_packed(str(path)) == pack(load_trace(str(path)))
