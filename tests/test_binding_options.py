"""Our flags, conflict checks and model-spec errors, without sglang (fast)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from types import SimpleNamespace

import pytest

from jenga_sglang.binding.factory import UnsupportedModelError, spec_from_model_config
from jenga_sglang.binding.options import (
    SERVER_POLICY,
    JengaFlagError,
    JengaOptions,
    add_jenga_args,
    check_conflicts,
    options_from_namespace,
)
from jenga_sglang.models import preset_config
from jenga_sglang.policies.branching import GHOST_TOKENS


def _server(**changes: object) -> JengaOptions:
    """Options with the server's policy record changed in `changes`."""
    return JengaOptions(enabled=True, policy=replace(SERVER_POLICY, **changes))


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--disable-radix-cache", action="store_true")
    parser.add_argument("--radix-cache-backend", default=None)
    parser.add_argument("--enable-unified-memory", action="store_true")
    parser.add_argument("--mamba-full-memory-ratio", type=float, default=None)
    parser.add_argument("--page-size", type=int, default=None)
    add_jenga_args(parser)
    add_jenga_args(parser)  # idempotent
    return parser.parse_args(list(argv))


def test_defaults_and_values() -> None:
    assert options_from_namespace(_parse()) == JengaOptions()
    ns = _parse("--enable-jenga", "--jenga-alpha", "0.25", "--jenga-admission", "speculative")
    check_conflicts(ns)
    assert options_from_namespace(ns) == _server(admission="speculative", alpha=0.25)
    assert options_from_namespace(ns).policy.prompt_end  # on unless switched off
    off = _parse("--enable-jenga", "--no-jenga-prompt-end")
    assert options_from_namespace(off).policy.prompt_end is False
    auto = _parse("--enable-jenga", "--jenga-alpha", "auto")
    assert options_from_namespace(auto).policy.alpha is None
    ghost = _parse("--enable-jenga", "--jenga-ghost-tokens", "0")
    assert options_from_namespace(ghost).policy.ghost_tokens == 0  # off
    assert options_from_namespace(_parse("--enable-jenga")).policy.ghost_tokens == GHOST_TOKENS
    assert options_from_namespace(_parse("--enable-jenga")).capture == "in-pass"
    cut = _parse("--enable-jenga", "--jenga-capture", "cut")
    assert options_from_namespace(cut).capture == "cut"
    with pytest.raises(JengaFlagError, match="--jenga-capture given without --enable-jenga"):
        check_conflicts(_parse("--jenga-capture", "cut"))


@pytest.mark.parametrize("bad", ["-1", "1e9", "lots"])
def test_bad_ghost_tokens_are_rejected(bad: str) -> None:
    with pytest.raises(SystemExit):
        _parse("--enable-jenga", "--jenga-ghost-tokens", bad)


@pytest.mark.parametrize(
    "argv",
    [("--jenga-policy", "marconi-faithful"), ("--jenga-admission", "speculative-sequence")],
)
def test_a_simulator_only_policy_is_refused_by_the_server(
    argv: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """It plans on the output, which a server does not know when it prefills."""
    with pytest.raises(SystemExit):
        _parse("--enable-jenga", *argv)
    assert argv[1] in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["-1", "nan", "fast"])
def test_bad_alpha_is_rejected(bad: str) -> None:
    with pytest.raises(SystemExit):
        _parse("--enable-jenga", "--jenga-alpha", bad)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--enable-jenga", "--disable-radix-cache"), "--disable-radix-cache"),
        (("--enable-jenga", "--radix-cache-backend", "flexkv"), "--radix-cache-backend flexkv"),
        (("--jenga-eviction", "lru"), "--jenga-eviction given without --enable-jenga"),
        (("--no-jenga-prompt-end",), "jenga-prompt-end given without --enable-jenga"),
        (("--jenga-pool",), "jenga-pool given without --enable-jenga"),
        (("--jenga-ghost-tokens", "5"), "jenga-ghost-tokens given without --enable-jenga"),
        (("--enable-jenga", "--enable-unified-memory"), "--jenga-pool .* --enable-unified-memory"),
        (
            ("--enable-jenga", "--mamba-full-memory-ratio", "0.5"),
            "--jenga-pool .* --mamba-full-memory-ratio",
        ),
    ],
)
def test_conflicts_name_the_flags(argv: tuple[str, ...], named: str) -> None:
    with pytest.raises(JengaFlagError, match=named):
        check_conflicts(_parse(*argv))


def test_explicit_jenga_backend_is_no_conflict() -> None:
    check_conflicts(_parse("--enable-jenga", "--radix-cache-backend", "jenga"))


def test_without_the_pool_sglang_memory_flags_are_no_conflict() -> None:
    ns = _parse("--enable-jenga", "--no-jenga-pool", "--enable-unified-memory", "--page-size", "16")
    check_conflicts(ns)
    assert options_from_namespace(ns).pool is False
    assert options_from_namespace(_parse("--enable-jenga")).pool  # on by default


def _model_config(config: dict[str, object]) -> SimpleNamespace:
    return SimpleNamespace(hf_config=SimpleNamespace(to_dict=lambda: dict(config)))


def test_spec_from_sglang_model_config_shards_per_rank() -> None:
    config = preset_config("nemotron-h-8b")
    one = spec_from_model_config(_model_config(config), tp_size=1)
    two = spec_from_model_config(_model_config(config), tp_size=2)
    assert one.has_mamba and two.state_bytes * 2 == one.state_bytes
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token


def test_unsupported_architecture_is_named() -> None:
    config = {"architectures": ["JambaForCausalLM"], "hidden_size": 64}
    with pytest.raises(UnsupportedModelError, match="JambaForCausalLM"):
        spec_from_model_config(_model_config(config), tp_size=1)


def test_server_tuning_runs_off_the_request_path_only_when_alpha_is_auto() -> None:
    from jenga_sglang.binding.policy import build_tuner

    tuner = build_tuner(JengaOptions(enabled=True))
    assert tuner is not None and tuner.background is not None and tuner.background.lag >= 1
    assert build_tuner(_server(alpha=0.5)) is None
    assert build_tuner(_server(eviction="lru")) is None
