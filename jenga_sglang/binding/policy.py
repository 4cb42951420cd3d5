"""Admission, eviction and alpha tuner from our flags (framework-free)."""

from __future__ import annotations

from jenga_sglang.binding.options import JengaOptions
from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.admission import EveryBlockAdmission, SpeculativeAdmission
from jenga_sglang.policies.background import BackgroundReplay, ShareChannel
from jenga_sglang.policies.bundles import jenga_admission
from jenga_sglang.policies.eviction import FlopAwareEviction, JengaEviction, LruEviction
from jenga_sglang.policies.tuning import AlphaTuner, SlidingTuner
from jenga_sglang.radix.contracts import AdmissionPolicy, EvictionPolicy


def build_admission(options: JengaOptions, spec: ModelSpec) -> AdmissionPolicy:
    if options.admission == "jenga":
        return jenga_admission(
            spec, prompt_end=options.prompt_end, ghost_tokens=options.ghost_tokens
        )
    if options.admission == "speculative":
        return SpeculativeAdmission(prompt_end=options.prompt_end)
    if options.admission == "every-block":
        return EveryBlockAdmission()
    raise ValueError(f"--jenga-admission: unknown policy {options.admission!r}")


def build_eviction(options: JengaOptions) -> EvictionPolicy:
    alpha = options.alpha or 0.0  # auto starts at 0 (Marconi: 0 until the first eviction)
    if options.eviction == "jenga":
        return JengaEviction(alpha)
    if options.eviction == "flop-aware":
        return FlopAwareEviction(alpha)
    if options.eviction == "lru":
        return LruEviction()
    raise ValueError(f"--jenga-eviction: unknown policy {options.eviction!r}")


def build_tuner(options: JengaOptions, channel: ShareChannel | None = None) -> AlphaTuner | None:
    """Online tuning only when alpha is 'auto' and the eviction reads alpha. In a server the
    replays run in a background process, off the request path (policies/background.py); with
    tensor parallelism `channel` gives every rank the leader's outcome (binding/tp_share.py)."""
    if options.alpha is not None or options.eviction == "lru":
        return None
    return SlidingTuner(background=BackgroundReplay(channel=channel))
