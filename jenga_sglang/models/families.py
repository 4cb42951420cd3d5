"""Spec builders for the families added for the live server (docs/models.md).

Registered into config.py's dispatch when `jenga_sglang.models` is imported: pure Mamba2 (no
attention), Gemma 3 (sliding-window and full attention layers), Qwen3.5 text (Gated DeltaNet,
dense MLP) and the plain full-attention families (Llama, Qwen2, Qwen3). Same conventions as
config.py: every field read is checked (hf_fields.py), shapes per tensor-parallel rank and FLOPs
per model (groups.py).
"""

from __future__ import annotations

from jenga_sglang.models.config import qwen3_next, register_builder
from jenga_sglang.models.groups import (
    attention_group,
    gated_deltanet_group,
    gated_mlp_flops,
    mamba2_flops,
    mamba_group,
)
from jenga_sglang.models.hf_fields import Ctx, Fields, Ssm
from jenga_sglang.models.spec import LayerGroup, MlpGroup


def _mamba2(f: Fields, ctx: Ctx) -> list[LayerGroup]:
    """Mamba2ForCausalLM: every layer one Mamba2 mixer, no attention and no MLP."""
    n, d = f.int("num_hidden_layers"), f.int("hidden_size")
    heads, hdim = f.int("num_heads"), f.int("head_dim")
    d_inner = f.int("expand") * d
    if heads * hdim != d_inner:
        raise f.error("head_dim", f"does not fit: {heads} heads x {hdim} != expand x hidden_size")
    ssm = Ssm(
        d_inner,
        heads,
        hdim,
        f.int("n_groups"),
        f.int("state_size"),
        f.int("conv_kernel"),
        "num_heads",
        "n_groups",
    )
    return [mamba_group(f, ctx, ssm, n, mamba2_flops(d, ssm))]


def _dense(f: Fields, ctx: Ctx) -> list[LayerGroup]:
    """A decoder of full-attention layers and gated MLPs (Llama, Qwen2, Qwen3)."""
    n, d = f.int("num_hidden_layers"), f.int("hidden_size")
    heads = f.int("num_attention_heads")
    head_dim = f.int("head_dim") if f.has("head_dim") else d // heads
    return [
        attention_group(f, ctx, "attention", n, head_dim),
        MlpGroup("mlp", n, float(gated_mlp_flops(d, f.int("intermediate_size")))),
    ]


def _count_layer_type(f: Fields, n: int, counted: str, other: str) -> int:
    """How many of the n entries of `layer_types` (each `counted` or `other`) are `counted`."""
    types = f.str_list("layer_types", {counted, other})
    if len(types) != n:
        raise f.error("layer_types", f"has {len(types)} entries for {n} layers")
    return types.count(counted)


def _gemma3(f: Fields, ctx: Ctx) -> list[LayerGroup]:
    """Gemma3ForCausalLM: sliding-window layers with a full attention layer every few."""
    n, d = f.int("num_hidden_layers"), f.int("hidden_size")
    if f.has("layer_types"):
        sliding = _count_layer_type(f, n, "sliding_attention", "full_attention")
    else:
        pattern = f.int("sliding_window_pattern")
        sliding = sum(1 for i in range(n) if (i + 1) % pattern)
    head_dim = f.int("head_dim")
    groups: list[LayerGroup] = []
    if n - sliding:
        groups.append(attention_group(f, ctx, "attention", n - sliding, head_dim))
    if sliding:
        window = f.int("sliding_window")
        groups.append(attention_group(f, ctx, "sliding", sliding, head_dim, window=window))
    return [*groups, MlpGroup("mlp", n, float(gated_mlp_flops(d, f.int("intermediate_size"))))]


def _qwen3_5(f: Fields, ctx: Ctx) -> list[LayerGroup]:
    """Qwen3.5 text (dense): Gated DeltaNet layers and gated full attention layers."""
    n, d = f.int("num_hidden_layers"), f.int("hidden_size")
    if f.has("layer_types"):
        full = _count_layer_type(f, n, "full_attention", "linear_attention")
    else:
        interval = f.int("full_attention_interval")
        full = sum(1 for i in range(n) if (i + 1) % interval == 0)
    attn = attention_group(f, ctx, "attention", full, f.int("head_dim"), output_gate=True)
    return [
        attn,
        gated_deltanet_group(f, ctx, n - full),
        MlpGroup("mlp", n, float(gated_mlp_flops(d, f.int("intermediate_size")))),
    ]


#: Plain full-attention architectures (no sliding window, no state layers).
DENSE_ARCHS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")

for _arch in DENSE_ARCHS:
    register_builder(_arch, _dense)
register_builder("Mamba2ForCausalLM", _mamba2)
register_builder("Gemma3ForCausalLM", _gemma3)
register_builder("Qwen3_5ForCausalLM", _qwen3_5)
# Qwen3.5-MoE text: Qwen3-Next's layout (routed + shared experts, no decoder_sparse_step).
register_builder("Qwen3_5MoeForCausalLM", qwen3_next)
