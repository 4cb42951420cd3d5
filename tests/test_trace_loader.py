"""Trace format: round trips (plain, .gz, .xz) and every kind of malformed line."""

from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path
from typing import Any

import pytest

from jenga_sglang.bench.traces.trace import (
    Request,
    TraceError,
    load_trace,
    load_trace_with_meta,
    write_trace,
)


def _reqs() -> list[Request]:
    return [
        Request(0, 0, 0.0, [5, 6, 7], [8, 9]),
        Request(1, 0, 0.5, [5, 6, 1], [2]),
        Request(0, 1, 1.25, [5, 6, 7, 8, 9, 10], []),
    ]


def _line(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "session_id": 3,
        "turn_id": 0,
        "ts": 1.5,
        "num_input_tokens": 3,
        "num_output_tokens": 1,
        "input_tokens": [1, 2, 3],
        "output_tokens": [4],
    }
    base.update(over)
    return base


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz", "t.jsonl.xz"])
def test_round_trip_with_meta(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    meta = {"kind": "unit", "params": {"rate": 1.0}}
    assert write_trace(path, _reqs(), meta) == 3
    got, got_meta = load_trace_with_meta(path)
    assert got == _reqs()
    assert got_meta == meta
    assert [r.num_input_tokens for r in got] == [3, 3, 6]
    assert [r.num_output_tokens for r in got] == [2, 1, 0]


def test_compressed_files_are_really_compressed(tmp_path: Path) -> None:
    write_trace(tmp_path / "a.jsonl.gz", _reqs())
    write_trace(tmp_path / "a.jsonl.xz", _reqs())
    with gzip.open(tmp_path / "a.jsonl.gz", "rt") as f:
        assert json.loads(f.readline())["session_id"] == 0
    with lzma.open(tmp_path / "a.jsonl.xz", "rt") as f:
        assert len(f.read().splitlines()) == 3


def test_external_gz_file_without_meta(tmp_path: Path) -> None:
    path = tmp_path / "ext.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(_line()) + "\n")
        f.write(json.dumps(_line(turn_id=1, ts=2)) + "\n")
    got, meta = load_trace_with_meta(path)
    assert meta == {}
    assert [(r.turn_id, r.ts) for r in got] == [(0, 1.5), (1, 2.0)]
    assert isinstance(got[1].ts, float)


BAD_LINES: list[tuple[str, str]] = [
    ('{"session_id": 3, "turn_id": ', "<json>"),
    ("[1, 2, 3]", "<json>"),
    ("", "<line>"),
    (json.dumps({k: v for k, v in _line().items() if k != "ts"}), "ts"),
    (json.dumps({k: v for k, v in _line().items() if k != "input_tokens"}), "input_tokens"),
    (json.dumps(_line(extra=1)), "extra"),
    (json.dumps(_line(session_id="a")), "session_id"),
    (json.dumps(_line(session_id=-1)), "session_id"),
    (json.dumps(_line(turn_id=1.0)), "turn_id"),
    (json.dumps(_line(turn_id=True)), "turn_id"),
    (json.dumps(_line(ts="0")), "ts"),
    (json.dumps(_line(ts=-0.5)), "ts"),
    (
        '{"session_id":3,"turn_id":0,"ts":NaN,"num_input_tokens":1,"num_output_tokens":0,'
        '"input_tokens":[1],"output_tokens":[]}',
        "ts",
    ),
    (json.dumps(_line(num_input_tokens=4)), "num_input_tokens"),
    (json.dumps(_line(num_output_tokens=0)), "num_output_tokens"),
    (json.dumps(_line(num_input_tokens="3")), "num_input_tokens"),
    (json.dumps(_line(input_tokens="1 2 3")), "input_tokens"),
    (json.dumps(_line(input_tokens=[1, 2.5, 3])), "input_tokens"),
    (json.dumps(_line(input_tokens=[1, -2, 3])), "input_tokens"),
    (json.dumps(_line(input_tokens=[], num_input_tokens=0)), "input_tokens"),
    (json.dumps(_line(output_tokens=[None])), "output_tokens"),
    (json.dumps(_line(ts=1.0)), "ts"),  # earlier than line 2's ts: unsorted
    (json.dumps(_line(ts=3.0, turn_id=0, session_id=0)), "turn_id"),  # repeats session 0 turn 0
]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
@pytest.mark.parametrize(("bad", "field"), BAD_LINES)
def test_malformed_line_names_file_line_and_field(
    tmp_path: Path, bad: str, field: str, suffix: str
) -> None:
    good = [
        json.dumps({"_meta": {"kind": "unit"}}),
        json.dumps(_line(session_id=0, ts=0.0)),
        json.dumps(_line(session_id=1, ts=1.2)),
    ]
    path = tmp_path / ("bad" + suffix)
    text = "\n".join([*good, bad, json.dumps(_line(session_id=9, ts=50.0))]) + "\n"
    if suffix == ".jsonl.gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 4, field)
    assert str(path) in str(err) and ":4:" in str(err) and f"'{field}'" in str(err)


def test_meta_only_allowed_on_first_line(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "m.jsonl", [json.dumps(_line()), json.dumps({"_meta": {"kind": "x"}})]
    )
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert info.value.line == 2


def test_bad_meta_type(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "m.jsonl", [json.dumps({"_meta": [1]}), json.dumps(_line())])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.line, info.value.field) == (1, "_meta")


def test_trace_error_is_value_error() -> None:
    assert issubclass(TraceError, ValueError)
