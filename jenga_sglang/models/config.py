"""Model specs from Hugging Face `config.json` dicts (framework-free: no torch, no sglang).

`spec_from_hf_config(config)` dispatches on `architectures[0]` to one small builder per
architecture (the `_BUILDERS` registry). Every field a builder reads is checked; a missing or
malformed one raises `ConfigError` naming the architecture and the field.

Family builders read their fields through `Fields` (hf_fields.py) and build each group with
groups.py, where the cache shapes and FLOP formulas are written down.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from jenga_sglang.models.groups import (
    attention_group,
    gated_deltanet_group,
    gated_mlp_flops,
    mamba2_flops,
    mamba_group,
    mlp_groups,
    moe_flops,
)
from jenga_sglang.models.hf_fields import ConfigError, Ctx, Fields, Ssm
from jenga_sglang.models.spec import DType, LayerGroup, MlpGroup, ModelSpec

_NEMOTRON_KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def _nemotron_h(f: Fields, ctx: Ctx) -> list[LayerGroup]:
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
        groups.append(attention_group(f, ctx, "attention", kinds.count("attention"), head_dim))
    if kinds.count("mamba"):
        heads, hdim = f.int("mamba_num_heads"), f.int("mamba_head_dim")
        ssm = Ssm(
            heads * hdim,
            heads,
            hdim,
            f.int("n_groups", "mamba_n_groups"),
            f.int("ssm_state_size"),
            f.int("conv_kernel", "mamba_d_conv"),
            "mamba_num_heads",
            "n_groups",
        )
        groups.append(mamba_group(f, ctx, ssm, kinds.count("mamba"), mamba2_flops(d, ssm)))
    mlp = 2 * 2 * d * f.int("intermediate_size") if "mlp" in kinds else 0
    moe = 0.0
    if "moe" in kinds:
        shared = f.int("n_shared_experts", minimum=0) * f.int("moe_shared_expert_intermediate_size")
        moe = moe_flops(
            d,
            f.int("n_routed_experts"),
            f.int("num_experts_per_tok"),
            2 * 2 * d * f.int("moe_intermediate_size"),
            2 * 2 * d * shared,
        )
    counts = {"mlp": (kinds.count("mlp"), float(mlp)), "moe": (kinds.count("moe"), moe)}
    return groups + mlp_groups(counts)


def qwen3_next(f: Fields, ctx: Ctx) -> list[LayerGroup]:
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
    attn = attention_group(f, ctx, "attention", sum(full), f.int("head_dim"), output_gate=True)
    mamba = gated_deltanet_group(f, ctx, n - sum(full))
    return [attn, mamba, *_qwen3_next_mlps(f, n, d)]


def _qwen3_next_mlps(f: Fields, n: int, d: int) -> list[LayerGroup]:
    _, dense_ids = f.get("mlp_only_layers") if f.has("mlp_only_layers") else ("", [])
    if not isinstance(dense_ids, list) or not all(isinstance(i, int) for i in dense_ids):
        raise f.error("mlp_only_layers", f"must be a list of layer indices, got {dense_ids!r}")
    experts = f.int("num_experts", minimum=0)
    step = f.int("decoder_sparse_step") if f.has("decoder_sparse_step") else 1
    moe_ids = [i for i in range(n) if i not in dense_ids and experts > 0 and (i + 1) % step == 0]
    moe = dense = 0.0
    if moe_ids:
        shared = gated_mlp_flops(d, f.int("shared_expert_intermediate_size", minimum=0))
        expert = gated_mlp_flops(d, f.int("moe_intermediate_size"))
        moe = moe_flops(d, experts, f.int("num_experts_per_tok"), expert, shared)
    if len(moe_ids) < n:
        dense = float(gated_mlp_flops(d, f.int("intermediate_size")))
    return mlp_groups({"moe": (len(moe_ids), moe), "mlp": (n - len(moe_ids), dense)})


def _falcon_h1(f: Fields, ctx: Ctx) -> list[LayerGroup]:
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
    ssm = Ssm(
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
        attention_group(f, ctx, "attention", n, head_dim),
        mamba_group(f, ctx, ssm, n, mamba2_flops(d, ssm)),
        MlpGroup("mlp", n, float(gated_mlp_flops(d, f.int("intermediate_size")))),
    ]


def _granite_moe_hybrid(f: Fields, ctx: Ctx) -> list[LayerGroup]:
    n, d = f.int("num_hidden_layers"), f.int("hidden_size")
    aliases = {"linear_attention": "mamba", "full_attention": "attention"}
    allowed = {"mamba", "attention", *aliases}
    types = [aliases.get(t, t) for t in f.str_list("layer_types", allowed)]
    if len(types) != n:
        raise f.error("layer_types", f"has {len(types)} entries for {n} layers")
    groups: list[LayerGroup] = []
    if types.count("attention"):
        head_dim = d // f.int("num_attention_heads")
        groups.append(attention_group(f, ctx, "attention", types.count("attention"), head_dim))
    if types.count("mamba"):
        d_inner = f.int("mamba_expand") * d
        heads, hdim = f.int("mamba_n_heads"), f.int("mamba_d_head")
        if heads * hdim != d_inner:
            raise f.error(
                "mamba_d_head",
                f"does not fit: {heads} heads x {hdim} != mamba_expand x hidden_size = {d_inner}",
            )
        ssm = Ssm(
            d_inner,
            heads,
            hdim,
            f.int("mamba_n_groups"),
            f.int("mamba_d_state"),
            f.int("mamba_d_conv"),
            "mamba_n_heads",
            "mamba_n_groups",
        )
        groups.append(mamba_group(f, ctx, ssm, types.count("mamba"), mamba2_flops(d, ssm)))
    shared = gated_mlp_flops(d, f.int("shared_intermediate_size"))
    experts = f.int("num_local_experts", minimum=0)
    if experts:
        expert = gated_mlp_flops(d, f.int("intermediate_size"))
        mlp = moe_flops(d, experts, f.int("num_experts_per_tok"), expert, shared)
    else:
        mlp = float(shared)
    return [*groups, MlpGroup("moe" if experts else "mlp", n, mlp)]


def _gpt_oss(f: Fields, ctx: Ctx) -> list[LayerGroup]:
    n, d = f.int("num_hidden_layers"), f.int("hidden_size")
    types = f.str_list("layer_types", {"full_attention", "sliding_attention"})
    if len(types) != n:
        raise f.error("layer_types", f"has {len(types)} entries for {n} layers")
    head_dim = f.int("head_dim")
    groups: list[LayerGroup] = []
    if types.count("full_attention"):
        groups.append(attention_group(f, ctx, "attention", types.count("full_attention"), head_dim))
    if types.count("sliding_attention"):
        window = f.int("sliding_window")
        layers = types.count("sliding_attention")
        groups.append(attention_group(f, ctx, "sliding", layers, head_dim, window=window))
    expert = gated_mlp_flops(d, f.int("intermediate_size"))
    top_k = f.int("num_experts_per_tok", "experts_per_token")
    moe = moe_flops(d, f.int("num_local_experts"), top_k, expert, 0)
    return [*groups, MlpGroup("moe", n, moe)]


Builder = Callable[[Fields, Ctx], list[LayerGroup]]

_BUILDERS: dict[str, Builder] = {
    "NemotronHForCausalLM": _nemotron_h,
    "Qwen3NextForCausalLM": qwen3_next,
    "FalconH1ForCausalLM": _falcon_h1,
    "GraniteMoeHybridForCausalLM": _granite_moe_hybrid,
    "GptOssForCausalLM": _gpt_oss,
}


def register_builder(arch: str, builder: Builder) -> None:
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
    fields = Fields(config, arch)
    groups = builder(fields, Ctx(tp_size, ssm_dtype))
    return ModelSpec(
        name=name or arch,
        groups=tuple(groups),
        hidden_size=fields.int("hidden_size"),
        source=f"HF config ({arch}), tp_size={tp_size}",
        extra={"architecture": arch, "tp_size": tp_size},
    )
