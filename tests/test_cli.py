"""jenga-bench CLI: the JSON contract, bad input (exit 2, one line), sweep records, report, and
that a pure-Python run never imports torch or sglang. Each case runs the CLI in a subprocess."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from jenga_sglang.bench.traces.trace import Request, sort_requests, write_trace

REPLAY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "trace": str,
    "policy": str,
    "model": str,
    "mode": str,
    "cache_bytes": int,
    "cache_gb": (int, float),
    "requests": int,
    "input_tokens": int,
    "hit_tokens": int,
    "token_hit_rate": float,
    "flops_saved": float,
    "peak_bytes": int,
    "capacity_violations": int,
    "wall_s": float,
    "tuning_s": float,
    "cpu_s": float,
    "tuning_cpu_s": float,
    "compiled": bool,
}
ENGINE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "ttft_p50_s": float,
    "ttft_p95_s": float,
    "ttft_p99_s": float,
    "throughput_tok_s": float,
    "decode_batch_mean": float,
    "decode_batch_max": int,
    "retractions": int,
    "ttft_cdf_s": list,
    "timeline": dict,
}


def cli(*args: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, *flags, "-m", "jenga_sglang.bench.cli.main", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two sessions of two turns; turn 1 of each extends turn 0's input + output."""
    path = tmp_path_factory.mktemp("traces") / "tiny.jsonl"
    reqs = []
    for sid in range(2):
        base = 1000 * (sid + 1)
        t0_in, t0_out = list(range(base, base + 40)), list(range(base + 40, base + 50))
        reqs.append(Request(sid, 0, float(sid), t0_in, t0_out))
        reqs.append(Request(sid, 1, 10.0 + sid, t0_in + t0_out + [7] * 20, [8] * 10))
    write_trace(path, sort_requests(reqs))
    return path


def replay_args(trace: Path, *extra: str) -> list[str]:
    return [
        "replay",
        "--trace",
        str(trace),
        "--model",
        "marconi-7b",
        "--cache-gb",
        "2",
        "--policy",
        "sglang-lru",
        "--json",
        *extra,
    ]


def check_fields(record: dict[str, object], fields: dict[str, type | tuple[type, ...]]) -> None:
    for name, kind in fields.items():
        assert name in record, f"missing {name}"
        assert isinstance(record[name], kind), f"{name}: {type(record[name]).__name__}"


def test_replay_json_contract_and_no_heavy_imports(trace: Path) -> None:
    res = cli(*replay_args(trace), flags=("-X", "importtime"))
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    check_fields(record, REPLAY_FIELDS)
    assert record["policy"] == "sglang-lru" and record["mode"] == "sequential"
    assert record["cache_bytes"] == 2 * 10**9
    assert (record["requests"], record["input_tokens"]) == (4, 2 * 40 + 2 * 70)
    assert record["hit_tokens"] == 2 * 50  # turn 1 of each session reuses turn 0's 50 tokens
    assert record["token_hit_rate"] == pytest.approx(100 / 220)
    assert record["capacity_violations"] == 0
    imported = {
        line.split("|")[-1].strip()
        for line in res.stderr.splitlines()
        if line.startswith("import time:")
    }
    heavy = {m for m in imported if m.split(".")[0] in ("torch", "sglang", "triton")}
    assert not heavy, sorted(heavy)[:5]


def test_engine_mode_json_contract(trace: Path) -> None:
    res = cli(*replay_args(trace, "--mode", "engine", "--check", "--cost", "mfu=0.4"))
    assert res.returncode == 0, res.stderr[-2000:]
    record = json.loads(res.stdout)
    check_fields(record, {**REPLAY_FIELDS, **ENGINE_FIELDS})
    assert record["mode"] == "engine" and record["requests"] == 4
    assert 0 < record["ttft_p50_s"] <= record["ttft_p95_s"] <= record["ttft_p99_s"]
    assert set(record["timeline"]) >= {"t", "used", "evictable", "free", "wasted"}


def test_bad_json_trace_and_bad_fields_exit_2(tmp_path: Path, trace: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"session_id": 0}\n', encoding="utf-8")
    cases = {
        "missing": (replay_args(tmp_path / "nope.jsonl"), "not found"),
        "malformed": (replay_args(bad), "bad.jsonl:1"),
        "policy": (replay_args(trace, "--policy", "fifo"), "unknown policy 'fifo'"),
        "model": (replay_args(trace, "--model", "gpt-9"), "unknown model 'gpt-9'"),
        "cost": (replay_args(trace, "--mode", "engine", "--cost", "speed=1"), "speed"),
    }
    for name, (args, needle) in cases.items():
        res = cli(*args)
        assert res.returncode == 2, (name, res.stderr)
        assert needle in res.stderr, (name, res.stderr)
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, name


def test_sweep_loads_traces_in_parallel_and_names_a_bad_one(tmp_path: Path, trace: Path) -> None:
    """Traces are parsed in worker processes; a bad one still fails cleanly with file:line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"session_id": 0}\n', encoding="utf-8")
    missing = tmp_path / "nope.jsonl"
    for other, needle in ((bad, "bad.jsonl:1: field 'turn_id'"), (missing, "not found")):
        args = ("sweep", "--trace", str(trace), "--trace", str(other), "--cache-gb", "2")
        res = cli(*args, "--policies", "sglang-lru", "--jobs", "2", "--no-progress")
        assert res.returncode == 2, res.stderr
        assert needle in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_sweep_records_carry_config_and_report_plots(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep.jsonl"
    res = cli(
        "sweep",
        "--trace",
        str(trace),
        "--model",
        "marconi-7b",
        "--cache-gb",
        "0.05,2",
        "--policies",
        "sglang-lru,jenga",
        "--json",
        "--jobs",
        "2",
        "--out",
        str(out),
    )
    assert res.returncode == 0, res.stderr[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4
    assert {(r["cache_gb"], r["policy"]) for r in records} == {
        (gb, p) for gb in (0.05, 2.0) for p in ("sglang-lru", "jenga")
    }
    for r in records:
        check_fields(r, REPLAY_FIELDS)
        assert r["trace"] == str(trace) and r["model"] == "marconi-7b"
    rep = cli("report", str(out), "--out", str(tmp_path / "report"))
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert "| tiny | sequential | 2 |" in rep.stdout
    assert (tmp_path / "report" / "hitrate-tiny-sequential.png").stat().st_size > 1000
    assert (tmp_path / "report" / "report.md").read_text() in rep.stdout


def test_sweep_csv_and_engine_plots(trace: Path, tmp_path: Path) -> None:
    res = cli(
        "sweep",
        "--trace",
        str(trace),
        "--cache-gb",
        "2",
        "--policies",
        "sglang-lru",
        "--mode",
        "engine",
        "--csv",
        "--jobs",
        "1",
        "--no-progress",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert len(rows) == 1 and rows[0]["mode"] == "engine" and "timeline" not in rows[0]
    assert float(rows[0]["ttft_p95_s"]) > 0
    jsonl = tmp_path / "engine.jsonl"
    res = cli(
        "sweep",
        "--trace",
        str(trace),
        "--cache-gb",
        "2",
        "--policies",
        "sglang-lru",
        "--mode",
        "engine",
        "--jobs",
        "1",
        "--no-progress",
        "--out",
        str(jsonl),
    )
    assert res.returncode == 0, res.stderr[-2000:]
    rep = cli("report", str(jsonl), "--out", str(tmp_path / "rep"))
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert (tmp_path / "rep" / "ttft-cdf-tiny-2GB.png").is_file()
    assert (tmp_path / "rep" / "memory-tiny-2GB.png").is_file()
