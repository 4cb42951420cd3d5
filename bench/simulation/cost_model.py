"""Step-time cost model of the engine simulator: a roofline over one batched step.

One engine step runs some prefill chunks and one decode token for every decoding request:

    compute_s = (prefill FLOPs + decode FLOPs) / (peak_flops * mfu)
    memory_s  = (weight bytes + decode bytes read) / (hbm_bytes_per_s * bandwidth_efficiency)
    step_s    = step_overhead_s + max(compute_s, memory_s)

so prefill time follows FLOPs (the compute roof dominates long chunks) and decode time follows
bytes read (weights once per step, plus every decoding request's KV context and SSM state).

* prefill FLOPs of tokens [a, b) of a request: `spec.prefill_flops(a, b)` (the same closed form
  that scores FLOPs saved, so a cache hit shortens TTFT by exactly what it saves);
* decode FLOPs of one token at context c: `spec.prefill_flops(c, c + 1)`;
* decode bytes of one request at context c: KV of every attention group over min(c, window)
  tokens, plus one SSM state (all Mamba layers) when the model has one;
* weight bytes: parameters estimated from the spec as linear FLOPs per token / 2 (one
  multiply-add per weight), times `weight_dtype_bytes`.

Defaults describe one H100 SXM (989 TFLOP/s dense bf16, 3.35 TB/s HBM3) at typical
efficiencies. They are calibratable: every field can be overridden (`--cost NAME=VALUE`), e.g.
with numbers fitted from a GPU run of SGLang on the same model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from jenga_sglang.models.spec import AttentionGroup, MambaGroup, MlpGroup, ModelSpec
from jenga_sglang.policies.host import overlapped_seconds


@dataclass(frozen=True)
class CostModel:
    peak_flops: float = 989e12  # dense bf16 FLOP/s
    mfu: float = 0.5  # fraction of peak a prefill step achieves
    hbm_bytes_per_s: float = 3.35e12
    bandwidth_efficiency: float = 0.7
    step_overhead_s: float = 0.002  # scheduler + launch latency per step
    weight_dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "step_overhead_s" and value >= 0:
                continue
            if not value > 0:
                raise ValueError(f"cost model field {f.name} must be > 0, got {value}")
        if self.mfu > 1 or self.bandwidth_efficiency > 1:
            raise ValueError("mfu and bandwidth_efficiency are fractions in (0, 1]")

    @classmethod
    def with_overrides(cls, overrides: dict[str, str]) -> CostModel:
        """A model with some fields set from strings (`--cost NAME=VALUE`); names are checked."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, float | int] = {}
        for name, text in overrides.items():
            if name not in known:
                raise ValueError(f"unknown cost model field {name!r}; known: {', '.join(known)}")
            try:
                values[name] = int(text) if known[name].type == "int" else float(text)
            except ValueError:
                raise ValueError(f"cost model field {name}: not a number: {text!r}") from None
        return cls(**values)  # type: ignore[arg-type]

    def first_token_seconds(self, flops: float, load_s: float, layers: int) -> float:
        """Sequential replay's time to first token: one step's overhead and a prefill of
        `flops` on the compute roof, overlapped layer by layer with `load_s` seconds of loads
        from a host tier (policies/host.py `overlapped_seconds`; docs/host-tier.md)."""
        compute = flops / (self.peak_flops * self.mfu)
        return self.step_overhead_s + overlapped_seconds(load_s, compute, layers)

    def step_seconds(self, flops: float, bytes_read: float) -> float:
        compute = flops / (self.peak_flops * self.mfu)
        memory = bytes_read / (self.hbm_bytes_per_s * self.bandwidth_efficiency)
        return self.step_overhead_s + max(compute, memory)


def weight_bytes(spec: ModelSpec, dtype_bytes: int) -> float:
    """Parameter bytes estimated from the linear FLOPs per token (2 FLOPs per weight)."""
    linear = 0.0
    for g in spec.groups:
        if isinstance(g, AttentionGroup | MambaGroup | MlpGroup):
            linear += g.num_layers * g.linear_flops_per_token
    return linear / 2 * dtype_bytes


def decode_bytes(spec: ModelSpec, context: int) -> int:
    """Bytes one decode step reads for a request whose context holds `context` tokens."""
    total = spec.state_bytes
    for g in spec.attention_groups:
        tokens = context if g.window is None else min(context, g.window)
        total += tokens * g.kv_bytes_per_token
    return total
