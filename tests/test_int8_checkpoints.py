"""`--int8-checkpoints`: SSM checkpoints stored as SGLang's `--enable-int8-mamba-checkpoint`
stores them (models/spec.py `int8_checkpoints`), in the spec's bytes, the replay's budget and
its records; refused where it is not modelled faithfully.

The tiny trace of tests/test_cli.py on nemotron-h-8b: two sessions whose first turns are 50
tokens (0.8 MB of KV) plus a state, 102.1 MB in fp32 and 28.2 MB quantized. A 110 MB budget
holds one session's full-precision turn, or both quantized ones."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from jenga_sglang.models import get_spec
from jenga_sglang.models.spec import DType, int8_checkpoints
from tests.test_cli import cli, replay_args, trace

__all__ = ["trace"]  # the fixture, shared with tests/test_cli.py


def test_a_quantized_checkpoint_is_int8_with_a_scale_per_head_and_k_channel() -> None:
    spec = get_spec("nemotron-h-8b")
    (g,) = spec.mamba_groups
    assert g.temporal_shape == (128, 64, 128) and g.temporal_dtype is DType.FP32
    (q,) = int8_checkpoints(spec).mamba_groups
    conv = math.prod(g.conv_shape) * g.conv_dtype.nbytes  # the conv window stays as it was
    per_layer = conv + 128 * 64 * 128 * 1 + 128 * 1 * 128 * 4  # int8 values + fp32 scales
    assert q.state_bytes == g.num_layers * per_layer == 28_213_248
    assert spec.state_bytes == 102_137_856 and q.temporal_scale_dtype is DType.FP32
    assert int8_checkpoints(spec).kv_bytes_per_token == spec.kv_bytes_per_token


@pytest.mark.parametrize(
    ("model", "why"),
    [("marconi-7b", r"\(heads, d_v, d_k\) state, got \(4096, 128\)"),
     ("gpt-oss-20b", "no SSM checkpoints")],
)  # fmt: skip
def test_specs_it_does_not_apply_to_are_refused(model: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        int8_checkpoints(get_spec(model))


def _replay(trace: Path, *extra: str) -> dict[str, object]:
    args = replay_args(trace, "--model", "nemotron-h-8b", "--cache-gb", "0.11", *extra)
    res = cli(*args)
    assert res.returncode == 0, res.stderr[-2000:]
    record: dict[str, object] = json.loads(res.stdout)
    return record


def test_quantized_checkpoints_fit_twice_the_sessions(trace: Path) -> None:
    full, int8 = _replay(trace), _replay(trace, "--int8-checkpoints")
    assert "int8_checkpoints" not in full, "full-precision records are as before"
    assert int8["int8_checkpoints"] is True
    assert int8["hit_tokens"] == 100, "both second turns hit their first turn's 50 tokens"
    assert full["hit_tokens"] < 100  # type: ignore[operator]
    assert int8["capacity_violations"] == full["capacity_violations"] == 0


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (("--mode", "engine"), "sequential replay"),
        (("--via", "sglang"), "sequential replay"),
        (("--memory", "sglang-split"), "--memory bytes or jenga"),
        (("--model", "marconi-7b"), "heads, d_v, d_k"),
    ],
)
def test_where_it_is_not_modelled_it_is_refused_in_one_line(
    trace: Path, extra: tuple[str, ...], why: str
) -> None:
    res = cli(*replay_args(trace, "--model", "nemotron-h-8b", "--int8-checkpoints", *extra))
    assert res.returncode == 2, res.stderr[-2000:]
    assert why in res.stderr and len(res.stderr.strip().splitlines()) == 1
