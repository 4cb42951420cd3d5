"""Model specs: Marconi's 7B numbers, HF-config presets checked by hand, FLOPs laws, errors."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from collections.abc import Callable

import pytest

from jenga_sglang.models import (
    AttentionGroup,
    ConfigError,
    DType,
    MambaGroup,
    ModelSpec,
    get_spec,
    marconi_7b,
    preset_config,
    preset_names,
    spec_from_hf_config,
    supported_architectures,
)

Cfg = dict[str, object]
REAL_PRESETS = [n for n in preset_names() if n != "marconi-7b"]


def _i(c: Cfg, key: str) -> int:
    value = c[key]
    assert isinstance(value, int)
    return value


# ---------------------------------------------------------------- Marconi's 7B, exactly

D, N = 4096, 128


def test_marconi_7b_bytes_exact() -> None:
    spec = marconi_7b()
    assert spec.kv_bytes_per_token == 4 * (2 * D * 2)
    assert spec.state_bytes == 24 * (D * N * 2 + (2 * D + 2 * N) * 4 * 2) == 26_787_840
    assert round(spec.state_bytes / spec.kv_bytes_per_token) == 409
    assert [(g.name, g.num_layers) for g in spec.groups] == [
        ("attention", 4),
        ("mamba", 24),
        ("mlp", 28),
    ]


@pytest.mark.parametrize("length", [0, 1, 7, 409, 1000, 8192])
def test_marconi_7b_flops_exact(length: int) -> None:
    ell = length
    attention = 8 * ell * D**2 + 4 * ell**2 * D
    mlp = 16 * ell * D**2
    mamba = 12 * ell * D**2 + 16 * ell * D * N + 10 * ell * D
    assert marconi_7b().flops(length) == 4 * attention + 28 * mlp + 24 * mamba


def test_marconi_7b_is_single_device() -> None:
    with pytest.raises(ValueError, match="tp_size=2"):
        get_spec("marconi-7b", tp_size=2)


# ---------------------------------------------------- presets: bytes computed by hand


def _mamba2_layer(inner: int, heads: int, hdim: int, groups: int, state: int, conv: int) -> int:
    """conv (inner + 2*groups*state, conv-1) bf16 + temporal (heads, hdim, state) fp32."""
    return (inner + 2 * groups * state) * (conv - 1) * 2 + heads * hdim * state * 4


def _nemotron(c: Cfg, tp: int) -> tuple[int, int]:
    pattern = c["hybrid_override_pattern"]
    assert isinstance(pattern, str)
    kv = pattern.count("*") * 2 * (_i(c, "num_key_value_heads") // tp)
    kv *= _i(c, "attention_head_dim") * 2
    heads, hdim = _i(c, "mamba_num_heads") // tp, _i(c, "mamba_head_dim")
    layer = _mamba2_layer(heads * hdim, heads, hdim, _i(c, "n_groups") // tp,
                          _i(c, "ssm_state_size"), _i(c, "conv_kernel"))  # fmt: skip
    return kv, pattern.count("M") * layer


def _qwen3_next(c: Cfg, tp: int) -> tuple[int, int]:
    n = _i(c, "num_hidden_layers")
    full = n // _i(c, "full_attention_interval")
    kv = full * 2 * (_i(c, "num_key_value_heads") // tp) * _i(c, "head_dim") * 2
    key_dim = _i(c, "linear_num_key_heads") // tp * _i(c, "linear_key_head_dim")
    value_heads = _i(c, "linear_num_value_heads") // tp
    value_dim = value_heads * _i(c, "linear_value_head_dim")
    conv = (2 * key_dim + value_dim) * (_i(c, "linear_conv_kernel_dim") - 1) * 2
    temporal = value_heads * _i(c, "linear_value_head_dim") * _i(c, "linear_key_head_dim") * 4
    return kv, (n - full) * (conv + temporal)


def _falcon_h1(c: Cfg, tp: int) -> tuple[int, int]:
    n = _i(c, "num_hidden_layers")
    kv = n * 2 * (_i(c, "num_key_value_heads") // tp) * _i(c, "head_dim") * 2
    heads, hdim = _i(c, "mamba_n_heads") // tp, _i(c, "mamba_d_head")
    groups = max(_i(c, "mamba_n_groups") // tp, 1)  # one group, replicated per rank
    layer = _mamba2_layer(_i(c, "mamba_d_ssm") // tp, heads, hdim, groups,
                          _i(c, "mamba_d_state"), _i(c, "mamba_d_conv"))  # fmt: skip
    return kv, n * layer


def _granite(c: Cfg, tp: int) -> tuple[int, int]:
    types = c["layer_types"]
    assert isinstance(types, list)
    head_dim = _i(c, "hidden_size") // _i(c, "num_attention_heads")
    kv = types.count("attention") * 2 * (_i(c, "num_key_value_heads") // tp) * head_dim * 2
    heads, hdim = _i(c, "mamba_n_heads") // tp, _i(c, "mamba_d_head")
    groups = max(_i(c, "mamba_n_groups") // tp, 1)
    inner = _i(c, "mamba_expand") * _i(c, "hidden_size") // tp
    layer = _mamba2_layer(inner, heads, hdim, groups, _i(c, "mamba_d_state"), _i(c, "mamba_d_conv"))
    return kv, types.count("mamba") * layer


def _gpt_oss(c: Cfg, tp: int) -> tuple[int, int]:
    per_layer = 2 * (_i(c, "num_key_value_heads") // tp) * _i(c, "head_dim") * 2
    return _i(c, "num_hidden_layers") * per_layer, 0


HAND: dict[str, Callable[[Cfg, int], tuple[int, int]]] = {
    "nemotron-h-8b": _nemotron,
    "qwen3-next-80b-a3b": _qwen3_next,
    "falcon-h1-7b": _falcon_h1,
    "granite-4.0-h-small": _granite,
    "gpt-oss-20b": _gpt_oss,
}


def test_every_shipped_preset_is_checked_and_sourced() -> None:
    assert sorted(HAND) == REAL_PRESETS
    for name in REAL_PRESETS:
        source = preset_config(name)["_source"]
        assert isinstance(source, str) and len(source) > 40


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("name", sorted(HAND))
def test_preset_bytes_match_hand_computation(name: str, tp: int) -> None:
    kv, state = HAND[name](preset_config(name), tp)
    spec = get_spec(name, tp_size=tp)
    assert (spec.kv_bytes_per_token, spec.state_bytes) == (kv, state)


def test_nemotron_h_8b_literal_numbers() -> None:
    spec = get_spec("nemotron-h-8b")
    assert spec.kv_bytes_per_token == 4 * 8 * 128 * 2 * 2
    (mamba,) = spec.mamba_groups
    assert mamba.conv_shape == (128 * 64 + 2 * 8 * 128, 3)
    assert mamba.temporal_shape == (128, 64, 128)
    assert (mamba.conv_dtype, mamba.temporal_dtype) == (DType.BF16, DType.FP32)


def test_gpt_oss_has_full_and_sliding_groups() -> None:
    spec = get_spec("gpt-oss-20b")
    windows = sorted((g.window or 0, g.num_layers) for g in spec.attention_groups)
    assert windows == [(0, 12), (128, 12)]
    assert not spec.has_mamba


# ---------------------------------------------------------------- tensor parallelism


@pytest.mark.parametrize("name", ["nemotron-h-8b", "qwen3-next-80b-a3b"])
def test_tp2_halves_mamba_state_per_rank(name: str) -> None:
    assert get_spec(name, 2).state_bytes * 2 == get_spec(name, 1).state_bytes


@pytest.mark.parametrize("name", ["falcon-h1-7b", "granite-4.0-h-small"])
def test_single_mamba_group_is_replicated_per_rank(name: str) -> None:
    one, two = (get_spec(name, tp).mamba_groups[0] for tp in (1, 2))
    assert two.temporal_bytes * 2 == one.temporal_bytes
    state = one.temporal_shape[2]
    inner = one.temporal_shape[0] * one.temporal_shape[1]
    assert one.conv_shape[0] == inner + 2 * state
    assert two.conv_shape[0] == inner // 2 + 2 * state


def test_kv_heads_are_replicated_beyond_their_count() -> None:
    spec = get_spec("gpt-oss-20b", tp_size=16)  # 8 KV heads, 64 query heads
    assert {g.num_kv_heads for g in spec.attention_groups} == {1}


def test_tp_that_does_not_divide_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"NemotronHForCausalLM.*num_attention_heads.*tp_size=3"):
        get_spec("nemotron-h-8b", tp_size=3)
    with pytest.raises(ConfigError, match="tp_size"):
        get_spec("nemotron-h-8b", tp_size=0)


def test_ssm_dtype_is_a_parameter() -> None:
    config = {k: v for k, v in preset_config("nemotron-h-8b").items() if k != "_source"}
    fp32 = spec_from_hf_config(config)
    bf16 = spec_from_hf_config(config, ssm_dtype=DType.BF16)
    assert bf16.mamba_groups[0].temporal_bytes * 2 == fp32.mamba_groups[0].temporal_bytes
    from_config = spec_from_hf_config({**config, "mamba_ssm_dtype": "bfloat16"})
    assert from_config.state_bytes == bf16.state_bytes


# ---------------------------------------------------------------- FLOPs laws

ALL = preset_names()


@pytest.mark.parametrize("name", ALL)
def test_prefill_flops_additive_and_monotone(name: str) -> None:
    spec = get_spec(name)
    points = [0, 1, 2, 63, 64, 127, 128, 129, 500, 4096]
    for a, b, c in zip(points, points[1:], points[2:], strict=False):
        left = spec.prefill_flops(a, b) + spec.prefill_flops(b, c)
        assert math.isclose(left, spec.prefill_flops(a, c), rel_tol=1e-12)
    totals = [spec.prefill_flops(0, p) for p in points]
    assert all(x < y for x, y in itertools.pairwise(totals))
    assert spec.prefill_flops(7, 7) == 0
    with pytest.raises(ValueError):
        spec.prefill_flops(5, 4)


def test_sliding_window_score_term_is_linear_beyond_window() -> None:
    spec = get_spec("gpt-oss-20b")
    sliding = next(g for g in spec.attention_groups if g.window is not None)
    full = next(g for g in spec.attention_groups if g.window is None)
    w = sliding.window
    assert w is not None

    def step(group: AttentionGroup, length: int) -> float:
        return group.flops(length + 1) - group.flops(length)

    assert step(sliding, w) == step(sliding, w + 1) == step(sliding, 10 * w)
    assert step(sliding, w // 2) < step(sliding, w)  # still growing inside the window
    assert step(full, w) < step(full, 10 * w)  # full attention keeps growing


def test_real_flops_follow_documented_formulas() -> None:
    c = preset_config("nemotron-h-8b")
    spec = get_spec("nemotron-h-8b")
    d, heads, kv, hd = 4096, _i(c, "num_attention_heads"), _i(c, "num_key_value_heads"), 128
    attn = spec.attention_groups[0]
    assert attn.linear_flops_per_token == 2 * d * (heads * hd + 2 * kv * hd) + 2 * heads * hd * d
    assert attn.score_flops_per_pair == 4 * heads * hd
    mlp = next(g for g in spec.groups if g.name == "mlp")
    assert mlp.linear_flops_per_token == 2 * 2 * d * _i(c, "intermediate_size")  # relu2: no gate


# ---------------------------------------------------------------- errors


def _optional(name: str) -> set[str]:
    """Fields a builder can do without (defaults or pure cross-checks)."""
    common = {"model_type", "_source"}
    extra = {
        "nemotron-h-8b": {"num_hidden_layers"},
        "qwen3-next-80b-a3b": {"mlp_only_layers", "decoder_sparse_step", "intermediate_size"},
        "falcon-h1-7b": {"mamba_expand", "mamba_d_head"},
    }
    return common | extra.get(name, set())


REQUIRED = [
    (name, field)
    for name in REAL_PRESETS
    for field in preset_config(name)
    if field not in _optional(name)
]


@pytest.mark.parametrize(("name", "field"), REQUIRED)
def test_missing_field_is_named(name: str, field: str) -> None:
    config = {k: v for k, v in preset_config(name).items() if k != field}
    with pytest.raises(ConfigError) as info:
        spec_from_hf_config(config)
    message = str(info.value)
    assert field in message
    if field != "architectures":
        assert str(preset_config(name)["architectures"]).strip("[]'") in message


@pytest.mark.parametrize("bad", ["4096", -1, 0, True, 4.5, None])
def test_malformed_field_is_named(bad: object) -> None:
    config = {**preset_config("granite-4.0-h-small"), "hidden_size": bad}
    with pytest.raises(ConfigError, match=r"GraniteMoeHybridForCausalLM.*'hidden_size'"):
        spec_from_hf_config(config)


def test_malformed_layer_layout_is_named() -> None:
    nemo = {**preset_config("nemotron-h-8b"), "hybrid_override_pattern": "M-X*"}
    with pytest.raises(ConfigError, match="hybrid_override_pattern"):
        spec_from_hf_config(nemo)
    gpt = preset_config("gpt-oss-20b")
    types = gpt["layer_types"]
    assert isinstance(types, list)
    with pytest.raises(ConfigError, match="layer_types"):
        spec_from_hf_config({**gpt, "layer_types": types[:-1]})
    with pytest.raises(ConfigError, match="torch_dtype"):
        spec_from_hf_config({**gpt, "torch_dtype": "int3"})


def test_unknown_architecture_names_itself_and_lists_supported() -> None:
    with pytest.raises(ConfigError) as info:
        spec_from_hf_config({"architectures": ["JambaForCausalLM"], "hidden_size": 8})
    message = str(info.value)
    assert "JambaForCausalLM" in message
    assert all(arch in message for arch in supported_architectures())
    assert len(supported_architectures()) >= 5


def test_unknown_preset_lists_known_ones() -> None:
    with pytest.raises(ValueError) as info:
        get_spec("llama-70b")
    assert "llama-70b" in str(info.value)
    assert all(name in str(info.value) for name in ALL)


def test_spec_rejects_degenerate_groups() -> None:
    with pytest.raises(ValueError, match="num_layers"):
        MambaGroup("m", 0, (4, 3), DType.BF16, (2, 2, 2), DType.FP32, 1.0)
    with pytest.raises(ValueError, match="window"):
        AttentionGroup("a", 1, 1, 8, DType.BF16, 1.0, 1.0, window=0)
    group = AttentionGroup("a", 1, 1, 8, DType.BF16, 1.0, 1.0)
    with pytest.raises(ValueError, match="duplicate"):
        ModelSpec("x", (group, group), hidden_size=8)


def test_models_package_never_imports_torch_or_sglang() -> None:
    code = (
        "import sys, jenga_sglang.models as m; m.get_spec('qwen3-next-80b-a3b', 2); "
        "print(sorted({'torch', 'sglang'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_nemotron_moe_layers_and_block_type_list() -> None:
    base = {k: v for k, v in preset_config("nemotron-h-8b").items() if k != "num_hidden_layers"}
    moe_fields = {
        "n_routed_experts": 128,
        "num_experts_per_tok": 6,
        "moe_intermediate_size": 1856,
        "n_shared_experts": 1,
        "moe_shared_expert_intermediate_size": 3712,
    }
    spec = spec_from_hf_config({**base, **moe_fields, "hybrid_override_pattern": "ME*EM-"})
    counts = {g.name: g.num_layers for g in spec.groups}
    assert counts == {"attention": 1, "mamba": 2, "mlp": 1, "moe": 2}
    moe = next(g for g in spec.groups if g.name == "moe")
    d = 4096
    assert moe.linear_flops_per_token == 6 * 4 * d * 1856 + 4 * d * 3712 + 2 * d * 128
    listed = {**base, **moe_fields, "layers_block_type": ["mamba", "moe", "attention", "moe"]}
    del listed["hybrid_override_pattern"]
    assert spec_from_hf_config(listed).kv_bytes_per_token == 1 * 2 * 8 * 128 * 2


def test_qwen3_next_layer_types_list_overrides_interval() -> None:
    config = {k: v for k, v in preset_config("qwen3-next-80b-a3b").items() if k != "_source"}
    types = ["linear_attention"] * 46 + ["full_attention"] * 2
    spec = spec_from_hf_config({**config, "layer_types": types})
    assert spec.attention_groups[0].num_layers == 2
    assert spec.mamba_groups[0].num_layers == 46
    dense = spec_from_hf_config({**config, "mlp_only_layers": [0, 1]})
    assert {g.name: g.num_layers for g in dense.groups if g.name in {"mlp", "moe"}} == {
        "moe": 46,
        "mlp": 2,
    }
