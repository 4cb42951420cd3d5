"""Our flags, conflict checks and model-spec errors, without sglang (fast)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from types import SimpleNamespace

import pytest

from jenga_sglang.binding.cache.factory import UnsupportedModelError, spec_from_model_config
from jenga_sglang.binding.options import (
    SERVER_POLICY,
    JengaFlagError,
    JengaOptions,
    add_jenga_args,
    check_conflicts,
    check_pool_attention,
    drop_pool_stand_ins,
    options_from_namespace,
    pool_attention_default,
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
    parser.add_argument("--speculative-algorithm", default=None)
    parser.add_argument("--device", default=None)
    for flag in (
        "--attention-backend",
        "--prefill-attention-backend",
        "--decode-attention-backend",
        "--speculative-draft-attention-backend",
    ):
        parser.add_argument(flag, default=None)
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
        (
            ("--enable-jenga", "--attention-backend", "fa3"),
            "--jenga-pool .* --attention-backend fa3",
        ),
        (
            ("--enable-jenga", "--prefill-attention-backend", "flashinfer"),
            "--jenga-pool .* --prefill-attention-backend flashinfer",
        ),
        (
            (
                "--enable-jenga",
                "--attention-backend",
                "triton",
                "--decode-attention-backend",
                "fa4",
            ),
            "--jenga-pool .* --decode-attention-backend fa4",
        ),
        (
            ("--enable-jenga", "--attention-backend", "trtllm_mha"),
            "pass --attention-backend triton .* or --no-jenga-pool",
        ),
        (
            ("--enable-jenga", "--speculative-draft-attention-backend", "flashinfer"),
            "pass --speculative-draft-attention-backend triton, or --no-jenga-pool",
        ),
        (
            ("--enable-jenga", "--speculative-algorithm", "EAGLE3"),
            "--jenga-pool .* --speculative-algorithm: only NGRAM, STANDALONE, EAGLE and NEXTN run",
        ),
    ],
)
def test_conflicts_name_the_flags(argv: tuple[str, ...], named: str) -> None:
    with pytest.raises(JengaFlagError, match=named):
        check_conflicts(_parse(*argv))


def test_explicit_jenga_backend_is_no_conflict() -> None:
    check_conflicts(_parse("--enable-jenga", "--radix-cache-backend", "jenga"))


def test_ngram_and_draft_models_run_over_the_pool() -> None:
    for algorithm in ("NGRAM", "standalone", "EAGLE", "NEXTN"):
        check_conflicts(_parse("--enable-jenga", "--speculative-algorithm", algorithm))
    for algorithm in ("EAGLE3", "DFLASH"):
        with pytest.raises(JengaFlagError, match="EAGLE3 is not tested"):
            check_conflicts(_parse("--enable-jenga", "--speculative-algorithm", algorithm))
    check_conflicts(_parse("--enable-jenga", "--no-jenga-pool", "--speculative-algorithm", "EAGLE"))


def test_without_the_pool_sglang_memory_flags_are_no_conflict() -> None:
    ns = _parse("--enable-jenga", "--no-jenga-pool", "--enable-unified-memory", "--page-size", "16")
    check_conflicts(ns)
    assert drop_pool_stand_ins(ns) == [] and ns.enable_unified_memory  # SGLang serves it
    assert options_from_namespace(ns).pool is False
    assert options_from_namespace(_parse("--enable-jenga")).pool  # on by default


def test_with_the_pool_its_stand_ins_are_dropped_naming_themselves() -> None:
    ns = _parse("--enable-jenga", "--enable-unified-memory", "--mamba-full-memory-ratio", "0.5")
    check_conflicts(ns)  # no conflict: the pool takes their place
    warnings = drop_pool_stand_ins(ns)
    assert (ns.enable_unified_memory, ns.mamba_full_memory_ratio) == (False, None)
    assert [w.split(" is dropped")[0] for w in warnings] == [
        "jenga: --enable-unified-memory",
        "jenga: --mamba-full-memory-ratio",
    ]
    assert drop_pool_stand_ins(_parse("--enable-unified-memory")) == []  # jenga off: SGLang's


@pytest.mark.parametrize(
    "argv",
    [
        ("--enable-jenga", "--attention-backend", "triton"),
        ("--enable-jenga", "--attention-backend", "torch_native"),
        ("--enable-jenga", "--prefill-attention-backend", "triton"),
        ("--enable-jenga", "--no-jenga-pool", "--attention-backend", "fa3"),  # SGLang's pools
        ("--attention-backend", "flashinfer"),  # stock SGLang
    ],
)
def test_attention_backends_the_pool_serves_or_does_not_use_are_no_conflict(
    argv: tuple[str, ...],
) -> None:
    check_conflicts(_parse(*argv))


@pytest.mark.parametrize(
    ("argv", "cuda", "chosen"),
    [
        (("--enable-jenga",), True, "triton"),  # SGLang would pick fa3 / flashinfer / trtllm_mha
        (("--enable-jenga", "--device", "cuda"), False, "triton"),
        (("--enable-jenga", "--device", "cuda:1"), True, "triton"),
        (("--enable-jenga", "--device", "xpu"), True, None),  # SGLang's pick, checked at build
        (("--enable-jenga", "--decode-attention-backend", "triton"), True, "triton"),  # prefill
        (("--enable-jenga",), False, None),  # CPU: SGLang's torch_native (or intel_amx) stays
        (("--enable-jenga", "--device", "cpu"), True, None),
        (("--enable-jenga", "--attention-backend", "torch_native"), True, None),  # named
        (
            ("--enable-jenga", "--prefill-attention-backend", "triton"),
            True,
            "triton",
        ),
        (
            (
                "--enable-jenga",
                "--prefill-attention-backend",
                "triton",
                "--decode-attention-backend",
                "torch_native",
            ),
            True,
            None,
        ),
        (("--enable-jenga", "--no-jenga-pool"), True, None),
        ((), True, None),
    ],
)
def test_the_pool_picks_triton_where_sglang_would_pick_an_unchecked_gpu_backend(
    argv: tuple[str, ...], cuda: bool, chosen: str | None
) -> None:
    assert pool_attention_default(_parse(*argv), cuda_available=cuda) == chosen


def test_the_plugin_sets_the_pool_default_before_sglang_resolves(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from jenga_sglang.binding import plugin

    for cuda, want in ((False, None), (True, "triton")):
        monkeypatch.setattr(plugin, "_cuda_available", lambda cuda=cuda: cuda)
        ns = _parse("--enable-jenga")
        plugin._before_from_cli_args(None, ns)
        assert ns.attention_backend == want and ns.radix_cache_backend == "jenga"
    assert "--jenga-pool serves --attention-backend triton" in caplog.text


@pytest.mark.parametrize(
    ("prefill", "decode", "named"),
    [
        ("fa3", "fa3", "--attention-backend fa3"),
        ("triton", "flashinfer", "--decode-attention-backend flashinfer"),
        ("trtllm_mha", "triton", "--prefill-attention-backend trtllm_mha"),
        ("intel_amx", "intel_amx", "--attention-backend intel_amx"),
    ],
)
def test_a_backend_sglang_resolved_for_the_pool_is_refused_unless_served(
    prefill: str, decode: str, named: str
) -> None:
    """The scheduler's check on SGLang's resolved pair (its defaults and model overrides
    included): nothing reaches a kernel that is not checked on the pool's views."""
    with pytest.raises(JengaFlagError, match=f"--jenga-pool .* {named}"):
        check_pool_attention(prefill, decode)
    check_pool_attention("triton", "triton")
    check_pool_attention("torch_native", "triton")


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
    from jenga_sglang.binding.cache.policy import build_tuner

    tuner = build_tuner(JengaOptions(enabled=True))
    assert tuner is not None and tuner.background is not None and tuner.background.lag >= 1
    assert build_tuner(_server(alpha=0.5)) is None
    assert build_tuner(_server(eviction="lru")) is None


def _pd(*argv: str) -> argparse.Namespace:
    ns = _parse(*argv)
    ns.disaggregation_mode = "null"
    ns.enable_pd_role_switch = False
    ns.disaggregation_decode_enable_radix_cache = False
    return ns


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_disaggregation_serves_the_pool_over_mooncake_only(mode: str) -> None:
    ns = _pd("--enable-jenga")
    ns.disaggregation_mode = mode
    check_conflicts(ns)  # the pool's page regions over SGLang's mooncake backend (the default)
    ns.disaggregation_transfer_backend = "nixl"
    with pytest.raises(JengaFlagError, match=r"transfer-backend nixl.*--no-jenga-pool"):
        check_conflicts(ns)
    ns.jenga_pool = False  # the fallback: SGLang's pools under our tree
    check_conflicts(ns)
    role_switch = _pd("--enable-jenga")
    role_switch.enable_pd_role_switch = True
    with pytest.raises(JengaFlagError, match=r"--enable-pd-role-switch.*--no-jenga-pool"):
        check_conflicts(role_switch)
    drafted = _pd("--enable-jenga", "--speculative-algorithm", "STANDALONE")
    drafted.disaggregation_mode = mode
    with pytest.raises(JengaFlagError, match=rf"STANDALONE under .*-mode {mode}.*--no-jenga-pool"):
        check_conflicts(drafted)
    drafted.speculative_algorithm = "NGRAM"  # no draft model: served over the pool
    check_conflicts(drafted)


def test_decode_side_radix_cache_serves_on_device_only_and_stock_pd_is_untouched() -> None:
    for pool in ((), ("--no-jenga-pool",)):
        ns = _pd("--enable-jenga", *pool)
        ns.disaggregation_mode = "decode"
        ns.disaggregation_decode_enable_radix_cache = True
        check_conflicts(ns)  # our tree on the decode side, matching on the KV alone
        ns.enable_hierarchical_cache = True
        with pytest.raises(JengaFlagError, match="keeps its tree on device only"):
            check_conflicts(ns)
        ns.enable_hierarchical_cache, ns.jenga_host_gb = False, 4.0
        with pytest.raises(JengaFlagError, match="keeps its tree on device only"):
            check_conflicts(ns)
        ns.disaggregation_mode = "prefill"  # the flag is the decode side's: prefill ignores it
        ns.disaggregation_bootstrap_port = 8998
        check_conflicts(ns)
    stock = _pd()
    stock.disaggregation_mode = "decode"
    stock.disaggregation_decode_enable_radix_cache = True
    stock.enable_hierarchical_cache = True
    check_conflicts(stock)  # without --enable-jenga nothing of ours applies
