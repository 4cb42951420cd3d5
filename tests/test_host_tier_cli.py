"""`jenga-bench replay|sweep --host-gb`: the host tier end to end through the CLI (records,
sizes given as multiples, refusals with one line and exit status 2).

The tiny trace of tests/test_cli.py: two sessions of two turns on marconi-7b, each first turn
50 tokens (3.3 MB of KV) plus a 26.8 MB state. A 40 MB device holds one of them: the second
session's first turn evicts the first's, which the tier keeps on host for its second turn."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_cli import cli, replay_args, trace

__all__ = ["trace"]  # the fixture, shared with tests/test_cli.py

KV, STATE = 65536, 26787840  # marconi-7b: bytes per KV token, per state


def replay(trace: Path, *extra: str) -> dict[str, object]:
    res = cli(*replay_args(trace, "--cache-gb", "0.04", *extra))
    assert res.returncode == 0, res.stderr[-2000:]
    record: dict[str, object] = json.loads(res.stdout)
    return record


def test_second_turns_hit_on_host_and_load_their_bytes(trace: Path) -> None:
    tiered, plain = replay(trace, "--host-gb", "4x"), replay(trace)
    assert tiered["host_gb"] == 0.16 and plain["host_gb"] == 0.0
    assert plain["hit_tokens"] == 0, "without the tier both first turns are gone"
    assert tiered["hit_tokens"] == tiered["host_hit_tokens"] == 100
    assert tiered["device_hit_tokens"] == 0
    assert tiered["host_load_bytes"] == 2 * (50 * KV + STATE), "both turns' KV and state"
    assert tiered["host_write_bytes"] >= tiered["host_load_bytes"], "each went down first"
    assert tiered["ttft_est_mean_s"] < plain["ttft_est_mean_s"]  # type: ignore[operator]
    assert tiered["capacity_violations"] == 0 and tiered["host_demoted_nodes"] >= 2


def test_host_gb_is_refused_where_it_does_not_run(trace: Path) -> None:
    cases = {
        "engine": (("--mode", "engine", "--host-gb", "1"), "sequential replay"),
        "unlocked": (("--policy", "marconi", "--host-gb", "1"), "locks the request's prefix"),
        "native": (("--cache", "sglang-native", "--policy", "", "--host-gb", "1"), "host"),
        "negative": (("--host-gb", "-1"), "host"),
        "bandwidth": (("--host-gb", "1", "--host-bw", "0"), "--host-bw"),
    }
    for name, (extra, needle) in cases.items():
        res = cli(*replay_args(trace, *extra))
        assert res.returncode == 2, (name, res.stderr)
        assert needle in res.stderr, (name, res.stderr)
        assert "Traceback" not in res.stderr, name


def test_sweep_sizes_the_host_per_cache_size(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs.jsonl"
    args = ["sweep", "--trace", str(trace), "--cache-gb", "0.04,0.08", "--policies"]
    res = cli(
        *args, "sglang-lru", "--host-gb", "2x", "--jobs", "1", "--no-progress", "--out", str(out)
    )
    assert res.returncode == 0, res.stderr[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["cache_gb"], r["host_gb"]) for r in records) == [(0.04, 0.08), (0.08, 0.16)]
    assert all("host_hit_tokens" in r and "ttft_est_p95_s" in r for r in records)


def test_a_hicache_sweep_sizes_each_host_before_it_validates(trace: Path) -> None:
    """SGLang's HiCache needs a host size: "Rx" resolves per cache size before validation."""
    from jenga_sglang.bench.cli.main import _sweep_grid, build_parser
    from jenga_sglang.bench.runs.sweep import grid

    caches = ["--caches", "sglang-native-hicache,jenga", "--policies", "jenga"]
    host = ["--host-gb", "4x", "--hicache-write-policy", "write_back"]
    args = build_parser().parse_args(
        ["sweep", "--trace", str(trace), "--cache-gb", "5,10", *caches, *host]
    )
    configs = _sweep_grid(args, grid)
    sizes = {(c.cache, c.cache_gb, c.host_gb, c.hicache_write) for c in configs}
    assert ("sglang-native-hicache", 5.0, 20.0, "write_back") in sizes
    assert ("sglang-native-hicache", 10.0, 40.0, "write_back") in sizes
    assert all(c.host_gb == 4 * c.cache_gb for c in configs)
