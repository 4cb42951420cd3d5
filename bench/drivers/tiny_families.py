"""Tiny random-weight configs, one per model family, for serving with SGLang on CPU.

scripts/make_tiny_model.py writes any of these (`--family NAME`): the config dict below, the
checkpoint layout of transformers' own model class for that family (built on the meta device,
so tensor names and shapes are the ones SGLang's loaders read from real checkpoints), seeded
values, and the shared locally trained tokenizer. Nothing is downloaded.

Every family is 4 layers, hidden 64, float32, so that a CPU server under the Triton interpreter
starts in about a minute. The layer mixes are the smallest that still exercise each family's
cache: at least one attention layer of each kind and at least one state layer where the family
has them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TinyFamily:
    """One family: transformers' config and model class names, the config fields, and the
    server flags it needs on CPU beyond bench/drivers/server.py's (the same for stock and Jenga)."""

    config_class: str
    model_class: str
    fields: dict[str, Any]
    serve_flags: tuple[str, ...] = ()
    serve_env: tuple[tuple[str, str], ...] = ()  # environment of both servers


#: Fields every family shares (token ids follow the shared tokenizer's special tokens).
COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
    "initializer_range": 0.02,
}

_ATTN = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
# The Mamba2 mixer fields Falcon-H1 and GraniteMoeHybrid name alike: 4 heads of 32, state 16.
_MAMBA2 = {
    "mamba_n_heads": 4,
    "mamba_d_head": 32,
    "mamba_n_groups": 1,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 64,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
}

FAMILIES: dict[str, TinyFamily] = {
    # Pattern M*M-: Mamba2, attention, Mamba2, MLP. Legacy field names, which both SGLang's and
    # transformers' NemotronH configs accept; SGLang's state shape reads `n_groups`.
    "nemotron_h": TinyFamily(
        "NemotronHConfig",
        "NemotronHForCausalLM",
        {
            "architectures": ["NemotronHForCausalLM"],
            "model_type": "nemotron_h",
            **_ATTN,
            "intermediate_size": 128,
            "hybrid_override_pattern": "M*M-",
            "mlp_hidden_act": "relu2",
            "attention_bias": False,
            "mlp_bias": False,
            "use_bias": False,
            "layer_norm_epsilon": 1e-5,
            "residual_in_fp32": False,
            "ssm_state_size": 16,
            "mamba_num_heads": 4,
            "mamba_head_dim": 32,
            "mamba_n_groups": 1,
            "n_groups": 1,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_hidden_act": "silu",
            "mamba_conv_bias": True,
            "mamba_proj_bias": False,
            "mamba_chunk_size": 64,
        },
    ),
    # Every block runs attention and a Mamba2 mixer side by side (parallel hybrid).
    "falcon_h1": TinyFamily(
        "FalconH1Config",
        "FalconH1ForCausalLM",
        {
            "architectures": ["FalconH1ForCausalLM"],
            "model_type": "falcon_h1",
            **_ATTN,
            "intermediate_size": 128,
            "mamba_d_ssm": 128,
            **_MAMBA2,
            "mamba_rms_norm": False,
            "mamba_norm_before_gate": False,
        },
    ),
    # Granite 4.0-H: Mamba2 and attention layers; dense (no routed experts) like its -micro size.
    "granite_moe_hybrid": TinyFamily(
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        {
            "architectures": ["GraniteMoeHybridForCausalLM"],
            "model_type": "granitemoehybrid",
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "shared_intermediate_size": 128,
            "num_local_experts": 0,
            "num_experts_per_tok": 0,
            "layer_types": ["mamba", "attention", "mamba", "mamba"],
            "position_embedding_type": "rope",
            **_MAMBA2,
        },
    ),
    # Pure Mamba2: no attention layer at all. SGLang's CPU loader
    # (adjust_config_with_unaligned_cpu_tp) reads the attention head counts of every model and
    # fails on None; these two fields are unused by the model otherwise.
    "mamba2": TinyFamily(
        "Mamba2Config",
        "Mamba2ForCausalLM",
        {
            "architectures": ["Mamba2ForCausalLM"],
            "model_type": "mamba2",
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "intermediate_size": 128,  # expand x hidden: SGLang's Mamba2 layer reads it
            "rms_norm": True,  # gated RMS norm in the mixer (HF Mamba2's default; SGLang reads it)
            "num_heads": 4,
            "head_dim": 32,
            "expand": 2,
            "n_groups": 1,
            "state_size": 16,
            "conv_kernel": 4,
            "chunk_size": 64,
            "use_bias": False,
            "use_conv_bias": True,
            "layer_norm_epsilon": 1e-5,
            "residual_in_fp32": False,
        },
    ),
    # Qwen3.5 text (dense): Gated DeltaNet linear attention, one full attention layer in four.
    # SGLang's config derives the layer kinds from `full_attention_interval`, transformers'
    # from `layer_types`: both given, and agreeing.
    "qwen3_5": TinyFamily(
        "Qwen3_5TextConfig",
        "Qwen3_5ForCausalLM",
        {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
            **_ATTN,
            "intermediate_size": 128,
            "layer_types": [
                "linear_attention",
                "linear_attention",
                "linear_attention",
                "full_attention",
            ],
            "full_attention_interval": 4,
            # SGLang's Qwen3.5 attention builds its RoPE from these; an empty dict is refused.
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
        },
        # Served in float32 like the others: the plugin's CPU mode lets SGLang's chunked Gated
        # DeltaNet kernel take float32 (it asserts bfloat16, which Triton's CPU interpreter
        # computes wrongly: jenga_sglang/cpu_gdn.py). Conv states in float32 too: SGLang keeps
        # them in bfloat16 by default, which rounds the conv window every step (log-probability
        # differences of 1e-2 between a state resumed from the cache and one recomputed), and
        # then the servers compute transformers' float32 model (tests/test_cpu_gdn.py).
        serve_env=(("SGLANG_MAMBA_CONV_DTYPE", "float32"),),
    ),
    # gpt-oss: alternating sliding-window (window 32) and full attention layers, MoE MLPs.
    "gpt_oss": TinyFamily(
        "GptOssConfig",
        "GptOssForCausalLM",
        {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            **_ATTN,
            "intermediate_size": 64,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 32,
            "layer_types": [
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "full_attention",
            ],
        },
        # SGLang's gpt-oss asserts a backend with attention sinks: its Triton one runs under
        # the interpreter on CPU (slowly; torch_native is refused at model load).
        serve_flags=("--attention-backend", "triton"),
        # A running request frees its out-of-window SWA slots every decode step, not every
        # 128 (SGLang's default): a short session then exercises those frees.
        serve_env=(("SGLANG_SWA_EVICTION_INTERVAL", "1"),),
    ),
    # Gemma 3 text: sliding-window layers (window 32) with one full attention layer.
    "gemma3": TinyFamily(
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            **_ATTN,
            "intermediate_size": 128,
            "sliding_window": 32,
            "query_pre_attn_scalar": 16,
            "layer_types": [
                "sliding_attention",
                "sliding_attention",
                "sliding_attention",
                "full_attention",
            ],
        },
    ),
    # A plain full-attention model: Jenga must hit exactly what SGLang's radix cache hits.
    "llama": TinyFamily(
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **_ATTN,
            "intermediate_size": 128,
            "rms_norm_eps": 1e-5,
        },
    ),
}

DEFAULT_FAMILY = "nemotron_h"


def family_config(name: str, vocab_size: int) -> dict[str, Any]:
    """The config.json dict of family `name` for a tokenizer of `vocab_size` rows."""
    if name not in FAMILIES:
        raise KeyError(f"unknown family {name!r}; pick one of {', '.join(FAMILIES)}")
    return {**COMMON, **FAMILIES[name].fields, "vocab_size": vocab_size}
