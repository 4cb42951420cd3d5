"""Model specs from Hugging Face `config.json` dicts (framework-free: no torch, no sglang).

`spec_from_hf_config(config)` dispatches on `architectures[0]` to one small builder per
architecture (the `_BUILDERS` registry). Every field a builder reads is checked; a missing or
malformed one raises `ConfigError` naming the architecture and the field.

Cache shapes are per tensor-parallel rank and follow SGLang 0.5.23:

* KV, per attention layer: K and V of `num_key_value_heads / tp` heads x `head_dim`, in the model
  dtype. With fewer KV heads than ranks, each rank holds one replicated head (`tp` must then be
  a multiple of the KV head count).
* Mamba2 state, per layer: conv `(d_inner/tp + 2*g*d_state, d_conv - 1)` in the model dtype and
  temporal `(n_heads/tp, head_dim, d_state)` in `ssm_dtype` (default: the config's
  `mamba_ssm_dtype`, else float32 as in SGLang). `g = n_groups/tp`; when there are fewer groups
  than ranks and `tp` is a multiple of them, every rank holds one replicated group.
* Gated DeltaNet (Qwen3-Next linear attention) uses the same two shapes with d_inner = value
  heads x value dim, heads = value heads, head_dim = value dim, groups = key heads and
  d_state = key dim.

FLOPs are for the whole model (not per rank), 2 per multiply-add, matmul-like work only (norms,
activations, rotary, softmax and biases are ignored). With d = hidden size:

* attention linear per token: `2*d*(q + 2*kv) + 2*q*d` (q = heads*head_dim, kv =
  kv_heads*head_dim), plus `2*d*q` for Qwen3-Next's output gate; scores per causal
  (query, key) pair: `4*q` (QK^T and AV).
* MLP per token: gated (SwiGLU) `2*3*d*ffn`; Nemotron-H's relu2 MLP and experts have no gate:
  `2*2*d*ffn`. MoE: `top_k` experts + shared expert + router `2*d*num_experts`.
* Mamba2 per token: in_proj `2*d*(2*d_inner + 2*G*N + H)` + depthwise conv `2*conv_dim*K` +
  state update `6*d_inner*N` + out_proj `2*d_inner*d` (G groups, N state size, H heads, K conv
  width). The state term is the recurrent form (decay, B x outer product, C readout: three
  multiply-adds per state element); the chunked SSD scan does work of the same order, linear
  in tokens either way, so this approximation keeps F(l) exactly additive.
* Gated DeltaNet per token: in_proj `2*d*(2*Kd + 2*Vd + 2*Hv)` + conv `2*(2*Kd + Vd)*K` +
  delta rule `7*Hv*dk*dv` (decay, k-readout, rank-1 update, q-readout) + out_proj `2*Vd*d`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from jenga_sglang.models.spec import (
    AttentionGroup,
    DType,
    LayerGroup,
    MambaGroup,
    MlpGroup,
    ModelSpec,
)


class ConfigError(ValueError):
    """A config.json that cannot be turned into a ModelSpec; the message names arch and field."""


class _Fields:
    """Typed, checked access to one architecture's config fields."""

    def __init__(self, config: Mapping[str, object], arch: str) -> None:
        self.config = config
        self.arch = arch

    def error(self, field: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.arch}: field {field!r} {problem}")

    def has(self, name: str) -> bool:
        return self.config.get(name) is not None

    def get(self, *names: str) -> tuple[str, object]:
        """The first present field among `names` (aliases), as (name, value)."""
        for name in names:
            if self.has(name):
                return name, self.config[name]
        alias = f" (or {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else ""
        raise ConfigError(f"{self.arch}: missing field {names[0]!r}{alias}")

    def int(self, *names: str, minimum: int = 1) -> int:
        name, value = self.get(*names)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(name, f"must be an integer >= {minimum}, got {value!r}")
        return value

    def str_list(self, name: str, allowed: set[str]) -> list[str]:
        _, value = self.get(name)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(name, f"must be a list of strings, got {value!r}")
        bad = sorted(set(value) - allowed)
        if bad:
            raise self.error(name, f"has unknown entries {bad}; expected {sorted(allowed)}")
        return list(value)

    def dtype(self, *names: str) -> DType:
        name, value = self.get(*names)
        try:
            return DType.parse(str(value))
        except ValueError as exc:
            raise self.error(name, str(exc)) from None


@dataclass(frozen=True)
class _Ctx:
    tp: int
    ssm_dtype: DType | None


@dataclass(frozen=True)
class _Ssm:
    """Full-model dims of one Mamba2-like mixer, with the field names used in error messages."""

    d_inner: int
    n_heads: int
    head_dim: int
    n_groups: int
    d_state: int
    d_conv: int
    heads_field: str
    groups_field: str


def _shard(f: _Fields, field: str, total: int, tp: int) -> int:
    if total % tp:
        raise f.error(field, f"= {total} is not divisible by tp_size={tp}")
    return total // tp


def _shard_or_replicate(f: _Fields, field: str, total: int, tp: int) -> int:
    """Split over ranks; fewer than `tp` (dividing it) are replicated, one per rank."""
    if total < tp and tp % total == 0:
        return 1
    return _shard(f, field, total, tp)


def _attention(
    f: _Fields,
    ctx: _Ctx,
    name: str,
    layers: int,
    head_dim: int,
    *,
    window: int | None = None,
    output_gate: bool = False,
) -> AttentionGroup:
    d = f.int("hidden_size")
    heads = f.int("num_attention_heads")
    kv_heads = f.int("num_key_value_heads")
    _shard(f, "num_attention_heads", heads, ctx.tp)
    q, kv = heads * head_dim, kv_heads * head_dim
    linear = 2 * d * (q + 2 * kv) + 2 * q * d + (2 * d * q if output_gate else 0)
    return AttentionGroup(
        name=name,
        num_layers=layers,
        num_kv_heads=_shard_or_replicate(f, "num_key_value_heads", kv_heads, ctx.tp),
        head_dim=head_dim,
        dtype=f.dtype("torch_dtype", "dtype"),
        linear_flops_per_token=float(linear),
        score_flops_per_pair=float(4 * q),
        window=window,
    )


def _mamba(f: _Fields, ctx: _Ctx, ssm: _Ssm, layers: int, flops: float) -> MambaGroup:
    heads = _shard(f, ssm.heads_field, ssm.n_heads, ctx.tp)
    groups = _shard_or_replicate(f, ssm.groups_field, ssm.n_groups, ctx.tp)
    ssm_dtype = ctx.ssm_dtype or (
        f.dtype("mamba_ssm_dtype") if f.has("mamba_ssm_dtype") else DType.FP32
    )
    return MambaGroup(
        name="mamba",
        num_layers=layers,
        conv_shape=(heads * ssm.head_dim + 2 * groups * ssm.d_state, ssm.d_conv - 1),
        conv_dtype=f.dtype("torch_dtype", "dtype"),
        temporal_shape=(heads, ssm.head_dim, ssm.d_state),
        temporal_dtype=ssm_dtype,
        linear_flops_per_token=flops,
    )


def _mamba2_flops(d: int, s: _Ssm) -> float:
    conv_dim = s.d_inner + 2 * s.n_groups * s.d_state
    in_proj = 2 * d * (2 * s.d_inner + 2 * s.n_groups * s.d_state + s.n_heads)
    return float(in_proj + 2 * conv_dim * s.d_conv + 6 * s.d_inner * s.d_state + 2 * s.d_inner * d)


def _gated_mlp(d: int, ffn: int) -> int:
    return 2 * 3 * d * ffn


def _moe(d: int, experts: int, top_k: int, expert_flops: int, shared_flops: int) -> float:
    return float(top_k * expert_flops + shared_flops + 2 * d * experts)


def _mlp_groups(counts: dict[str, tuple[int, float]]) -> list[LayerGroup]:
    return [MlpGroup(name, n, flops) for name, (n, flops) in counts.items() if n]


# ----------------------------------------------------------------------------- builders


_NEMOTRON_KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def _nemotron_h(f: _Fields, ctx: _Ctx) -> list[LayerGroup]:
    field, layout = f.get("hybrid_override_pattern", "layers_block_type")
    if field == "layers_block_type":
        kinds = f.str_list(field, set(_NEMOTRON_KINDS.values()))
    elif isinstance(layout, str) and layout and not set(layout) - set(_NEMOTRON_KINDS):
        kinds = [_NEMOTRON_KINDS[c] for c in layout]
    else:
        raise f.error(field, f"must be a string over 'M*-E', got {layout!r}")
    if f.has("num_hidden_layers") and f.int("num_hidden_layers") != len(kinds):
        raise f.error(
            "num_hidden_layers",
            f"= {f.int('num_hidden_layers')} but the pattern has {len(kinds)} layers",
        )
    d = f.int("hidden_size")
    groups: list[LayerGroup] = []
    if kinds.count("attention"):
        head_dim = f.int("head_dim", "attention_head_dim")
        groups.append(_attention(f, ctx, "attention", kinds.count("attention"), head_dim))
    if kinds.count("mamba"):
        heads, hdim = f.int("mamba_num_heads"), f.int("mamba_head_dim")
        ssm = _Ssm(
            heads * hdim,
            heads,
            hdim,
            f.int("n_groups", "mamba_n_groups"),
            f.int("ssm_state_size"),
            f.int("conv_kernel", "mamba_d_conv"),
            "mamba_num_heads",
            "n_groups",
        )
        groups.append(_mamba(f, ctx, ssm, kinds.count("mamba"), _mamba2_flops(d, ssm)))
    mlp = 2 * 2 * d * f.int("intermediate_size") if "mlp" in kinds else 0
    moe = 0.0
    if "moe" in kinds:
        shared = f.int("n_shared_experts", minimum=0) * f.int("moe_shared_expert_intermediate_size")
        moe = _moe(
            d,
            f.int("n_routed_experts"),
            f.int("num_experts_per_tok"),
            2 * 2 * d * f.int("moe_intermediate_size"),
            2 * 2 * d * shared,
        )
    counts = {"mlp": (kinds.count("mlp"), float(mlp)), "moe": (kinds.count("moe"), moe)}
    return groups + _mlp_groups(counts)


def _gated_deltanet(f: _Fields, ctx: _Ctx, layers: int) -> MambaGroup:
    """The linear-attention (Gated DeltaNet) layers of Qwen3-Next and Qwen3.5, as a state group."""
    d = f.int("hidden_size")
    nk, nv = f.int("linear_num_key_heads"), f.int("linear_num_value_heads")
    dk, dv = f.int("linear_key_head_dim"), f.int("linear_value_head_dim")
    ssm = _Ssm(
        nv * dv,
        nv,
        dv,
        nk,
        dk,
        f.int("linear_conv_kernel_dim"),
        "linear_num_value_heads",
        "linear_num_key_heads",
    )
    kd, vd = nk * dk, nv * dv
    gdn = 2 * d * (2 * kd + 2 * vd + 2 * nv) + 2 * (2 * kd + vd) * ssm.d_conv + 7 * nv * dk * dv
    gdn += 2 * vd * d
    return _mamba(f, ctx, ssm, layers, float(gdn))


def _qwen3_next(f: _Fields, ctx: _Ctx) -> list[LayerGroup]:
    n = f.int("num_hidden_layers")
    if f.has("layer_types"):
        types = f.str_list("layer_types", {"full_attention", "linear_attention"})
        if len(types) != n:
            raise f.error("layer_types", f"has {len(types)} entries for {n} layers")
        full = [t == "full_attention" for t in types]
    else:
        interval = f.int("full_attention_interval")
        full = [(i + 1) % interval == 0 for i in range(n)]
    d = f.int("hidden_size")
    attn = _attention(f, ctx, "attention", sum(full), f.int("head_dim"), output_gate=True)
    mamba = _gated_deltanet(f, ctx, n - sum(full))
    return [attn, mamba, *_qwen3_next_mlps(f, n, d)]


def _qwen3_next_mlps(f: _Fields, n: int, d: int) -> list[LayerGroup]:
    _, dense_ids = f.get("mlp_only_layers") if f.has("mlp_only_layers") else ("", [])
    if not isinstance(dense_ids, list) or not all(isinstance(i, int) for i in dense_ids):
        raise f.error("mlp_only_layers", f"must be a list of layer indices, got {dense_ids!r}")
    experts = f.int("num_experts", minimum=0)
    step = f.int("decoder_sparse_step") if f.has("decoder_sparse_step") else 1
    moe_ids = [i for i in range(n) if i not in dense_ids and experts > 0 and (i + 1) % step == 0]
    moe = dense = 0.0
    if moe_ids:
        shared = _gated_mlp(d, f.int("shared_expert_intermediate_size", minimum=0))
        expert = _gated_mlp(d, f.int("moe_intermediate_size"))
        moe = _moe(d, experts, f.int("num_experts_per_tok"), expert, shared)
    if len(moe_ids) < n:
        dense = float(_gated_mlp(d, f.int("intermediate_size")))
    return _mlp_groups({"moe": (len(moe_ids), moe), "mlp": (n - len(moe_ids), dense)})


def _falcon_h1(f: _Fields, ctx: _Ctx) -> list[LayerGroup]:
    n, d = f.int("num_hidden_layers"), f.int("hidden_size")
    # Falcon-H1's head_dim is not hidden_size / heads (7B: 12 x 128 < 3072): never guess it.
    head_dim = f.int("head_dim")
    d_inner = f.int("mamba_d_ssm") if f.has("mamba_d_ssm") else f.int("mamba_expand") * d
    m_heads = f.int("mamba_n_heads")
    _, raw_head = f.get("mamba_d_head") if f.has("mamba_d_head") else ("", "auto")
    m_head = d_inner // m_heads if raw_head == "auto" else f.int("mamba_d_head")
    if m_heads * m_head != d_inner:
        raise f.error(
            "mamba_d_head",
            f"does not fit: {m_heads} heads x {m_head} != d_ssm {d_inner} "
            "(mamba_d_ssm, or mamba_expand x hidden_size)",
        )
    ssm = _Ssm(
        d_inner,
        m_heads,
        m_head,
        f.int("mamba_n_groups"),
        f.int("mamba_d_state"),
        f.int("mamba_d_conv"),
        "mamba_n_heads",
        "mamba_n_groups",
    )
    return [
        _attention(f, ctx, "attention", n, head_dim),
        _mamba(f, ctx, ssm, n, _mamba2_flops(d, ssm)),
        MlpGroup("mlp", n, float(_gated_mlp(d, f.int("intermediate_size")))),
    ]


def _granite_moe_hybrid(f: _Fields, ctx: _Ctx) -> list[LayerGroup]:
    n, d = f.int("num_hidden_layers"), f.int("hidden_size")
    aliases = {"linear_attention": "mamba", "full_attention": "attention"}
    allowed = {"mamba", "attention", *aliases}
    types = [aliases.get(t, t) for t in f.str_list("layer_types", allowed)]
    if len(types) != n:
        raise f.error("layer_types", f"has {len(types)} entries for {n} layers")
    groups: list[LayerGroup] = []
    if types.count("attention"):
        head_dim = d // f.int("num_attention_heads")
        groups.append(_attention(f, ctx, "attention", types.count("attention"), head_dim))
    if types.count("mamba"):
        d_inner = f.int("mamba_expand") * d
        heads, hdim = f.int("mamba_n_heads"), f.int("mamba_d_head")
        if heads * hdim != d_inner:
            raise f.error(
                "mamba_d_head",
                f"does not fit: {heads} heads x {hdim} != mamba_expand x hidden_size = {d_inner}",
            )
        ssm = _Ssm(
            d_inner,
            heads,
            hdim,
            f.int("mamba_n_groups"),
            f.int("mamba_d_state"),
            f.int("mamba_d_conv"),
            "mamba_n_heads",
            "mamba_n_groups",
        )
        groups.append(_mamba(f, ctx, ssm, types.count("mamba"), _mamba2_flops(d, ssm)))
    shared = _gated_mlp(d, f.int("shared_intermediate_size"))
    experts = f.int("num_local_experts", minimum=0)
    if experts:
        expert = _gated_mlp(d, f.int("intermediate_size"))
        mlp = _moe(d, experts, f.int("num_experts_per_tok"), expert, shared)
    else:
        mlp = float(shared)
    return [*groups, MlpGroup("moe" if experts else "mlp", n, mlp)]


def _gpt_oss(f: _Fields, ctx: _Ctx) -> list[LayerGroup]:
    n, d = f.int("num_hidden_layers"), f.int("hidden_size")
    types = f.str_list("layer_types", {"full_attention", "sliding_attention"})
    if len(types) != n:
        raise f.error("layer_types", f"has {len(types)} entries for {n} layers")
    head_dim = f.int("head_dim")
    groups: list[LayerGroup] = []
    if types.count("full_attention"):
        groups.append(_attention(f, ctx, "attention", types.count("full_attention"), head_dim))
    if types.count("sliding_attention"):
        window = f.int("sliding_window")
        layers = types.count("sliding_attention")
        groups.append(_attention(f, ctx, "sliding", layers, head_dim, window=window))
    expert = _gated_mlp(d, f.int("intermediate_size"))
    top_k = f.int("num_experts_per_tok", "experts_per_token")
    moe = _moe(d, f.int("num_local_experts"), top_k, expert, 0)
    return [*groups, MlpGroup("moe", n, moe)]


_Builder = Callable[[_Fields, _Ctx], list[LayerGroup]]

_BUILDERS: dict[str, _Builder] = {
    "NemotronHForCausalLM": _nemotron_h,
    "Qwen3NextForCausalLM": _qwen3_next,
    "FalconH1ForCausalLM": _falcon_h1,
    "GraniteMoeHybridForCausalLM": _granite_moe_hybrid,
    "GptOssForCausalLM": _gpt_oss,
}


def register_builder(arch: str, builder: _Builder) -> None:
    """Add the builder of one more architecture (models/families.py registers its own)."""
    if arch in _BUILDERS:
        raise ValueError(f"architecture {arch!r} already has a builder")
    _BUILDERS[arch] = builder


def supported_architectures() -> list[str]:
    """HF `architectures[0]` values that `spec_from_hf_config` understands."""
    return sorted(_BUILDERS)


def spec_from_hf_config(
    config: Mapping[str, object],
    *,
    tp_size: int = 1,
    name: str | None = None,
    ssm_dtype: DType | None = None,
) -> ModelSpec:
    """Build the per-rank ModelSpec of an HF config.json dict.

    `tp_size` shards KV heads and Mamba heads/groups as SGLang does (see the module docstring);
    `ssm_dtype` overrides the temporal SSM state dtype. Raises ConfigError (a ValueError) naming
    the architecture and the field for a missing/malformed field or a tp_size that does not
    divide a sharded dimension, and listing the supported architectures for an unknown one.
    """
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConfigError(f"config: field 'architectures' must be a non-empty list, got {archs!r}")
    arch = archs[0]
    builder = _BUILDERS.get(arch)
    if builder is None:
        raise ConfigError(
            f"unsupported architecture {arch!r}; supported: {', '.join(supported_architectures())}"
        )
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ConfigError(f"{arch}: tp_size must be a positive integer, got {tp_size!r}")
    fields = _Fields(config, arch)
    groups = builder(fields, _Ctx(tp_size, ssm_dtype))
    return ModelSpec(
        name=name or arch,
        groups=tuple(groups),
        hidden_size=fields.int("hidden_size"),
        source=f"HF config ({arch}), tp_size={tp_size}",
        extra={"architecture": arch, "tp_size": tp_size},
    )
