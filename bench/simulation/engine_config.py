"""What the stepped engine (bench/simulation/engine.py) may vary, and what it measures.

One engine loop serves both the engine-mode replays and the fragmentation study; the points
where the two used to differ are fields of `EngineConfig`, so one figure can be reproduced under
the other's rules. The defaults are the engine replay's (SGLang's scheduler, roughly);
`study_config` in bench/studies/frag_timeline.py gives the study's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from mypy_extensions import mypyc_attr

from jenga_sglang.bench.simulation.replay import ReplayStats

ChunkBudget = Literal["shared", "per-request"]
Preemption = Literal["restart", "reprefill"]
Reserve = Literal["tokens", "fraction"]
StepOrder = Literal["phased", "in-order"]
AdmissionRule = Literal["fits", "free-bytes"]

_CHOICES: dict[str, tuple[str, ...]] = {
    "chunk_budget": ("shared", "per-request"),
    "preemption": ("restart", "reprefill"),
    "reserve": ("tokens", "fraction"),
    "step_order": ("phased", "in-order"),
    "admission_rule": ("fits", "free-bytes"),
}


# Sent between processes: mypyc-compiled frozen dataclasses cannot be unpickled, so this one
# stays a Python class in the optional build (scripts/build_compiled.py).
@mypyc_attr(native_class=False)
@dataclass(frozen=True)
class EngineConfig:
    """The engine's scheduling rules; every field's default is the engine replay's.

    * `chunk_budget`: "shared": one step prefills at most `chunk_tokens` tokens in all, in
      admission order (SGLang's chunked prefill); "per-request": every prefilling request
      takes a chunk of up to `chunk_tokens` tokens in the same step.
    * `preemption`, what a request pushed out of the batch does when it comes back:
      "restart": it starts over (its decoded tokens are lost); "reprefill": it prefills its
      input plus the tokens it decoded and carries on decoding.
    * `reserve`, the decode tokens an admission sets aside per request: "tokens": at most
      `decode_reserve_tokens` (a restarted request: its whole output); "fraction":
      `decode_reserve_fraction` of its remaining output, rounded half up.
    * `step_order`: "phased": every decoding request decodes a token, then the prefill chunks
      run, the step that completes a prefill also produces the first token, and finished
      requests leave at the end of the step; "in-order": each running request in admission
      order takes a chunk or decodes a token, the first token comes one step after the
      prefill, and a request leaves (freeing its pages) the moment it finishes.
    * `state_at_admission`: a request takes its live SSM state when admitted (admission stops
      for the step when it cannot get one) rather than at its first allocation.
    * `admission_rule`, what the reserves are checked against: "fits": the memory's `fits`
      (bytes any page type can take once the evictable is evicted); "free-bytes" (Jenga pools
      only): the bytes in no held page, empty small pages of carved large pages included,
      even though only their own type can take them.
    """

    chunk_tokens: int = 8192  # prefill tokens per step (SGLang's chunked_prefill_size default)
    max_running: int = 256  # requests in one batch at most
    decode_reserve_tokens: int = 256  # decode tokens reserved per request at admission
    chunk_budget: ChunkBudget = "shared"
    preemption: Preemption = "restart"
    reserve: Reserve = "tokens"
    decode_reserve_fraction: float = 0.5
    step_order: StepOrder = "phased"
    state_at_admission: bool = False
    admission_rule: AdmissionRule = "fits"

    def __post_init__(self) -> None:
        for name in ("chunk_tokens", "max_running"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine {name} must be >= 1, got {getattr(self, name)}")
        if self.decode_reserve_tokens < 0:
            raise ValueError(f"decode_reserve_tokens must be >= 0: {self.decode_reserve_tokens}")
        if not 0.0 <= self.decode_reserve_fraction <= 1.0:
            raise ValueError(
                f"decode_reserve_fraction must be in [0, 1]: {self.decode_reserve_fraction}"
            )
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"engine {name} must be one of {allowed}: {getattr(self, name)!r}")


@dataclass
class EngineStats(ReplayStats):
    """ReplayStats plus latency, batching and memory over (simulated) time."""

    ttfts: list[float] = field(default_factory=list)
    makespan_s: float = 0.0
    steps: int = 0
    retractions: int = 0
    rejected: int = 0
    #: One row per step: (time, decode batch, prefill tokens, used, evictable, wasted, free bytes).
    timeline: list[tuple[float, int, int, int, int, int, int]] = field(default_factory=list)
    #: One row per step: bytes held (used + evictable) by KV pages and by SSM state pages.
    held_by_kind: list[tuple[int, int]] = field(default_factory=list)
    #: One entry per step: its duration from the cost model.
    step_seconds: list[float] = field(default_factory=list)
