"""How SGLang 0.5.23 would split one byte budget between its KV pool and its Mamba pool.

Pure arithmetic (no torch, no sglang), so the CLI can validate and report it cheaply.

Static split (the default, `--mamba-full-memory-ratio` r = 0.9), as
`KVCacheConfigurator` does it for a hybrid Mamba model without speculative decoding:

    mamba_budget = budget * r / (1 + r)
    mamba_slots  = (mamba_budget - slot_bytes) // slot_bytes   # the pool keeps one padding slot
    kv_tokens    = (budget - (mamba_slots + 1) * slot_bytes) // kv_bytes_per_token

`slot_bytes` is one Mamba state for every Mamba layer (the spec's `state_bytes`) and
`kv_bytes_per_token` is the KV of every full-attention layer (the spec's `kv_bytes_per_token`).
SGLang computes the same in GiB floats; we use exact integers. Mamba slots serve both the
running requests (one live state + two ping-pong track slots each with the `extra_buffer`
strategy) and the cached checkpoints: there is no separate checkpoint pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from jenga_sglang.models.spec import ModelSpec

DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9


@dataclass(frozen=True)
class SglangSplit:
    """Slot counts of SGLang's two pools for one byte budget."""

    budget_bytes: int
    kv_tokens: int
    mamba_slots: int
    kv_bytes_per_token: int
    state_bytes: int

    @property
    def kv_bytes(self) -> int:
        return self.kv_tokens * self.kv_bytes_per_token

    @property
    def mamba_bytes(self) -> int:
        """Bytes of the Mamba pool, its padding slot included."""
        return (self.mamba_slots + 1) * self.state_bytes


def static_split(
    spec: ModelSpec, budget_bytes: int, ratio: float = DEFAULT_MAMBA_FULL_MEMORY_RATIO
) -> SglangSplit:
    """SGLang's static KV/Mamba split of `budget_bytes`; ValueError when nothing fits."""
    if not spec.has_mamba:
        raise ValueError(f"model {spec.name!r} has no Mamba layers: SGLang's split needs them")
    if not ratio > 0:
        raise ValueError(f"mamba_full_memory_ratio must be > 0, got {ratio}")
    slot = spec.state_bytes
    per_token = spec.kv_bytes_per_token
    mamba_budget = budget_bytes * ratio / (1 + ratio)
    slots = int((mamba_budget - slot) // slot)
    kv_tokens = (budget_bytes - (slots + 1) * slot) // per_token if slots > 0 else 0
    if slots < 4 or kv_tokens <= 0:
        raise ValueError(
            f"budget of {budget_bytes} bytes is too small for SGLang's split of {spec.name!r}: "
            f"{slots} Mamba slots of {slot} bytes (at least 4), {kv_tokens} KV tokens"
        )
    return SglangSplit(budget_bytes, kv_tokens, slots, per_token, slot)
