"""The one builder from a policy record (policies/registry.py) to its policy objects.

`build_policies(record, spec, background)` is what every driver calls: the simulator
(`build_cache`, below), and the SGLang backend (binding/cache/policy.py), with or without `--via
sglang`. Where the tuner's replays run is the caller's context, passed in: inline when
`background` is None (the simulator), in a worker process adopted a fixed number of requests
later otherwise (the server, whose `BackgroundReplay` carries the tensor-parallel channel).
"""

from __future__ import annotations

from typing import NamedTuple

from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.admission import EveryBlockAdmission, SpeculativeAdmission
from jenga_sglang.policies.background import BackgroundReplay
from jenga_sglang.policies.branching import GHOST_TOKENS, BranchLearningAdmission
from jenga_sglang.policies.eviction import FlopAwareEviction, JengaEviction, LruEviction
from jenga_sglang.policies.host import FlopAwareTier, HostSpec, tier_layers
from jenga_sglang.policies.reference_eviction import MarconiEviction
from jenga_sglang.policies.registry import PolicyRecord, bundle
from jenga_sglang.policies.tuners import MarconiTuner, SlidingTuner
from jenga_sglang.policies.tuning import AlphaTuner
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.contracts import AdmissionPolicy, EvictionPolicy
from jenga_sglang.radix.memory import ByteBudget, CacheMemory
from jenga_sglang.radix.pages import PageKind, PageType


class Policies(NamedTuple):
    """The objects one record builds, for one cache."""

    admission: AdmissionPolicy
    eviction: EvictionPolicy
    tuner: AlphaTuner | None


def min_branch_tokens(spec: ModelSpec, fraction: float = 0.25) -> int:
    """Shortest branch worth a checkpoint: `fraction` of the tokens whose KV weighs one state.

    An attention-free model (pure Mamba2, `extra["attention_free"]`) holds no KV, so a branch
    of any length weighs no more than its state: every branch point is worth one."""
    if not spec.has_mamba or not spec.kv_bytes_per_token or spec.extra.get("attention_free"):
        return 0
    return round(fraction * spec.state_bytes / spec.kv_bytes_per_token)


def jenga_admission(
    spec: ModelSpec, prompt_end: bool = False, ghost_tokens: int = GHOST_TOKENS
) -> AdmissionPolicy:
    """The jenga bundle's admission: speculative, short branches only where popular, branch
    points of evicted sequences recalled from a ghost index, and expendable tails once
    requests rewrite their history (`policies/branching.py`); with `prompt_end` (the server's
    default) also the state at the end of each input."""
    return BranchLearningAdmission(
        min_branch_tokens=min_branch_tokens(spec),
        # without SSM states a hit ends anywhere: no branch point needs a checkpoint
        ghost_tokens=ghost_tokens if spec.has_mamba else 0,
        prompt_end=prompt_end,
    )


def build_admission(record: PolicyRecord, spec: ModelSpec) -> AdmissionPolicy:
    if record.admission == "jenga":
        return jenga_admission(spec, record.prompt_end, record.ghost_tokens)
    if record.admission in ("speculative", "speculative-sequence"):
        return SpeculativeAdmission(
            prompt_end=record.prompt_end, on_sequence=record.admission == "speculative-sequence"
        )
    return EveryBlockAdmission()  # whole blocks: no prompt-end state, no ghost index


def build_eviction(record: PolicyRecord) -> EvictionPolicy:
    alpha = 0.0 if record.alpha is None else record.alpha  # auto: 0 until the tuner picks one
    if record.eviction == "jenga":
        return JengaEviction(alpha)
    if record.eviction == "flop-aware":
        return FlopAwareEviction(alpha)
    if record.eviction == "marconi":
        return MarconiEviction(alpha)
    return LruEviction()


def build_tuner(
    record: PolicyRecord, background: BackgroundReplay | None = None
) -> AlphaTuner | None:
    """The record's tuner, replaying inline (`background` None) or in `background`'s worker."""
    if not record.tuned:
        return None
    if record.tuner == "sliding":
        return SlidingTuner(background=background)
    if record.tuner == "marconi":
        return MarconiTuner(background=background)
    return MarconiTuner(multiplier=2, scored_tail=None, from_start=False, background=background)


def build_policies(
    record: PolicyRecord, spec: ModelSpec, background: BackgroundReplay | None = None
) -> Policies:
    """Admission, eviction and tuner of `record` for a cache of `spec`."""
    return Policies(
        build_admission(record, spec), build_eviction(record), build_tuner(record, background)
    )


def byte_budget(spec: ModelSpec, cache_bytes: int) -> ByteBudget:
    """Marconi's accounting: one page per token of KV per attention group, one per SSM state."""
    sizes = {
        PageType(PageKind.KV, spec.groups.index(g)): g.kv_bytes_per_token
        for g in spec.attention_groups
    }
    for g in spec.mamba_groups:
        sizes[PageType(PageKind.STATE, spec.groups.index(g))] = g.state_bytes
    return ByteBudget(cache_bytes, sizes)


def build_cache(
    name: str, spec: ModelSpec, memory: CacheMemory, host: HostSpec | None = None
) -> tuple[PrefixCache, AlphaTuner | None]:
    """The simulator's cache for bundle `name`: its tuner replays inline. `host`: a host-memory
    tier under it, run by `FlopAwareTier` with the bundle's eviction (policies/host.py)."""
    record = bundle(name)
    admission, eviction, tuner = build_policies(record, spec)
    cache = PrefixCache(spec, memory, eviction, admission, record.lock_prefix)
    if host is not None:
        tier = FlopAwareTier(eviction, host.bandwidth, host.flop_rate, tier_layers(spec))
        cache.attach_host(host.memory, tier)
    return cache, tuner
