"""Named policy bundles: admission + eviction + alpha tuning, as used by `--policy NAME`.

vllm-blocks   every-block admission (a state every 32 tokens) + LRU
sglang-lru    speculative admission + LRU                    (Marconi's "SGLang+")
marconi       speculative admission + Marconi's eviction as the reference computes it + one-shot
              tuning on the reference's schedule
marconi-postevict  marconi with our earlier schedule (window after the first eviction)
marconi-linear     marconi before the reference comparison (linear recency, node's own
                   bytes, prefix locked)
jenga         speculative admission + FLOP-aware eviction + sliding re-tuning
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.admission import EveryBlockAdmission, SpeculativeAdmission
from jenga_sglang.policies.branching import GHOST_TOKENS, BranchLearningAdmission
from jenga_sglang.policies.eviction import FlopAwareEviction, JengaEviction, LruEviction
from jenga_sglang.policies.reference_eviction import MarconiEviction
from jenga_sglang.policies.tuning import AlphaTuner, MarconiTuner, SlidingTuner
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.contracts import AdmissionPolicy, EvictionPolicy
from jenga_sglang.radix.memory import ByteBudget, CacheMemory
from jenga_sglang.radix.pages import PageKind, PageType


@dataclass(frozen=True)
class Bundle:
    name: str
    description: str
    admission: Callable[[ModelSpec], AdmissionPolicy]
    eviction: Callable[[], EvictionPolicy]
    tuner: Callable[[], AlphaTuner | None]
    #: False: an insert may evict the request's own cached prefix (the reference simulator's
    #: order, radix/commit.py `insert_unlocked`); True: the prefix stays locked (a real engine).
    lock_prefix: bool = True


def min_branch_tokens(spec: ModelSpec, fraction: float = 0.25) -> int:
    """Shortest branch worth a checkpoint: `fraction` of the tokens whose KV weighs one state.

    An attention-free model (pure Mamba2, `extra["attention_free"]`) holds no KV, so a branch
    of any length weighs no more than its state: every branch point is worth one."""
    if not spec.has_mamba or not spec.kv_bytes_per_token or spec.extra.get("attention_free"):
        return 0
    return round(fraction * spec.state_bytes / spec.kv_bytes_per_token)


def _speculative(spec: ModelSpec) -> AdmissionPolicy:
    return SpeculativeAdmission()


def _every_block(spec: ModelSpec) -> AdmissionPolicy:
    return EveryBlockAdmission()


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


BUNDLES: dict[str, Bundle] = {
    b.name: b
    for b in (
        Bundle(
            "vllm-blocks",
            "every-block admission (B=32) + LRU",
            _every_block,
            LruEviction,
            lambda: None,
        ),
        Bundle(
            "sglang-lru",
            "speculative admission + LRU (SGLang+)",
            _speculative,
            LruEviction,
            lambda: None,
        ),
        Bundle(
            "marconi",
            "speculative admission + Marconi's eviction as the reference computes it (1 / age "
            "recency, efficiency per byte of the whole path) + one-shot tuning on the "
            "reference's schedule",
            _speculative,
            MarconiEviction,
            MarconiTuner,
            lock_prefix=False,
        ),
        Bundle(
            "marconi-linear",
            "marconi as it was before the comparison with the reference simulator: our "
            "earlier eviction terms (min-max of the last access, efficiency per byte the node "
            "holds; policies/eviction.py) and the request's prefix locked",
            _speculative,
            FlopAwareEviction,
            MarconiTuner,
        ),
        Bundle(
            "marconi-postevict",
            "marconi with our earlier tuning schedule: window of N requests after the first "
            "eviction, replayed from the cache at that eviction, scored whole",
            _speculative,
            MarconiEviction,
            lambda: MarconiTuner(multiplier=2, scored_tail=None, from_start=False),
            lock_prefix=False,
        ),
        Bundle(
            "jenga",
            "speculative admission (no checkpoints at short branches) + FLOP-aware eviction "
            "that drops superseded checkpoints first + sliding re-tuning",
            jenga_admission,
            JengaEviction,
            SlidingTuner,
        ),
    )
}


def bundle(name: str) -> Bundle:
    """A bundle by name; `marconi@A` is Marconi's bundle with alpha fixed to A (no tuning), the
    building block of the per-configuration hindsight oracle."""
    base, sep, alpha_text = name.partition("@")
    if sep and base == "marconi":
        try:
            alpha = float(alpha_text)
        except ValueError:
            raise ValueError(f"bad alpha in policy {name!r}: expected marconi@<float>") from None
        if alpha < 0:
            raise ValueError(f"bad alpha in policy {name!r}: alpha must be >= 0")
        return Bundle(
            name,
            f"marconi with alpha fixed to {alpha}",
            _speculative,
            lambda: MarconiEviction(alpha),
            lambda: None,
            lock_prefix=False,
        )
    try:
        return BUNDLES[name]
    except KeyError:
        known = ", ".join([*BUNDLES, "marconi@<alpha>"])
        raise ValueError(f"unknown policy {name!r}; known: {known}") from None


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
    name: str, spec: ModelSpec, memory: CacheMemory
) -> tuple[PrefixCache, AlphaTuner | None]:
    b = bundle(name)
    cache = PrefixCache(spec, memory, b.eviction(), b.admission(spec), b.lock_prefix)
    return cache, b.tuner()
