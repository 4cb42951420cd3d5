"""Layer groups of a ModelSpec from checked config fields: cache shapes and FLOPs per group.

The family builders (config.py, families.py) count layers; the functions here turn one kind of
layer into its group. Cache shapes are per tensor-parallel rank and follow SGLang 0.5.23:

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

from jenga_sglang.models.hf_fields import Ctx, Fields, Ssm, shard, shard_or_replicate
from jenga_sglang.models.spec import AttentionGroup, DType, LayerGroup, MambaGroup, MlpGroup


def attention_group(
    f: Fields,
    ctx: Ctx,
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
    shard(f, "num_attention_heads", heads, ctx.tp)
    q, kv = heads * head_dim, kv_heads * head_dim
    linear = 2 * d * (q + 2 * kv) + 2 * q * d + (2 * d * q if output_gate else 0)
    return AttentionGroup(
        name=name,
        num_layers=layers,
        num_kv_heads=shard_or_replicate(f, "num_key_value_heads", kv_heads, ctx.tp),
        head_dim=head_dim,
        dtype=f.dtype("torch_dtype", "dtype"),
        linear_flops_per_token=float(linear),
        score_flops_per_pair=float(4 * q),
        window=window,
    )


def mamba_group(f: Fields, ctx: Ctx, ssm: Ssm, layers: int, flops: float) -> MambaGroup:
    heads = shard(f, ssm.heads_field, ssm.n_heads, ctx.tp)
    groups = shard_or_replicate(f, ssm.groups_field, ssm.n_groups, ctx.tp)
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


def mamba2_flops(d: int, s: Ssm) -> float:
    conv_dim = s.d_inner + 2 * s.n_groups * s.d_state
    in_proj = 2 * d * (2 * s.d_inner + 2 * s.n_groups * s.d_state + s.n_heads)
    return float(in_proj + 2 * conv_dim * s.d_conv + 6 * s.d_inner * s.d_state + 2 * s.d_inner * d)


def gated_mlp_flops(d: int, ffn: int) -> int:
    return 2 * 3 * d * ffn


def moe_flops(d: int, experts: int, top_k: int, expert_flops: int, shared_flops: int) -> float:
    return float(top_k * expert_flops + shared_flops + 2 * d * experts)


def mlp_groups(counts: dict[str, tuple[int, float]]) -> list[LayerGroup]:
    return [MlpGroup(name, n, flops) for name, (n, flops) in counts.items() if n]


def gated_deltanet_group(f: Fields, ctx: Ctx, layers: int) -> MambaGroup:
    """The linear-attention (Gated DeltaNet) layers of Qwen3-Next and Qwen3.5, as a state group."""
    d = f.int("hidden_size")
    nk, nv = f.int("linear_num_key_heads"), f.int("linear_num_value_heads")
    dk, dv = f.int("linear_key_head_dim"), f.int("linear_value_head_dim")
    ssm = Ssm(
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
    return mamba_group(f, ctx, ssm, layers, float(gdn))
