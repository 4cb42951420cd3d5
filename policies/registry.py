"""Policy records and the one registry of named bundles (data only: no policy class is built here).

A `PolicyRecord` says which admission, eviction and alpha tuning a cache runs. Every driver
takes one: the simulator (`jenga-bench --policy NAME`), the SGLang server (`--jenga-policy NAME`
and the `--jenga-*` flags that override its fields, binding/options.py) and the simulator's
drive of our SGLang backend (`--via sglang`). policies/bundles.py builds the objects from it.

vllm-blocks   every-block admission (a state every 32 tokens) + LRU
sglang-lru    speculative admission + LRU                    (Marconi's "SGLang+")
sglang-lru-faithful  sglang-lru with the reference simulator's branch checkpoint and unlocked
              prefix; the simulator's sequential serving only
marconi       speculative admission + Marconi's eviction as the reference computes it + one-shot
              tuning on the reference's schedule
marconi-faithful   marconi with the reference's branch checkpoint (where input + output
                   leaves the tree); the simulator's sequential serving only
marconi-postevict  marconi with our earlier schedule (window after the first eviction)
marconi-linear     marconi before the reference comparison (linear recency, node's own
                   bytes, prefix locked)
jenga         speculative admission + FLOP-aware eviction + sliding re-tuning
marconi@A     marconi with alpha fixed to A (no tuning): the hindsight oracle's building block

Kept free of the policy classes so that parsing flags and names (the server's launcher, the
CLI's validation) loads no tree or tuner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from jenga_sglang.policies.branching import GHOST_TOKENS

Admission = Literal["jenga", "speculative", "speculative-sequence", "every-block"]
Eviction = Literal["jenga", "flop-aware", "lru", "marconi"]
Tuner = Literal["none", "sliding", "marconi", "marconi-postevict"]

ADMISSIONS: tuple[str, ...] = get_args(Admission)
#: What a server can run: 'speculative-sequence' plans on the output, unknown at admission.
SERVER_ADMISSIONS: tuple[str, ...] = tuple(a for a in ADMISSIONS if a != "speculative-sequence")
EVICTIONS: tuple[str, ...] = get_args(Eviction)
TUNERS: tuple[str, ...] = get_args(Tuner)


@dataclass(frozen=True)
class PolicyRecord:
    """What to build: the fields name kinds, not objects, so a record is hashable and picklable.

    admission    which SSM states enter the cache: 'jenga' (policies/branching.py),
                 'speculative' (Marconi, branch where the input leaves the tree),
                 'speculative-sequence' (the reference simulator's: where input + output
                 leaves it; sequential serving only), 'every-block' (vLLM's blocks of 32)
    eviction     'jenga' (superseded checkpoints first while few are resumed from again, then
                 FLOP-aware), 'flop-aware' (Marconi as we first wrote it), 'marconi'
                 (Marconi as the reference computes it), 'lru'
    alpha        FLOP weight of the eviction; None is 'auto': 0 until the tuner picks one
    tuner        how 'auto' is tuned: 'sliding' (ours), 'marconi' (the reference's one shot),
                 'marconi-postevict' (our earlier one shot), 'none'. No tuner runs when alpha
                 is fixed or the eviction (LRU) reads no alpha
    prompt_end   speculative admissions also keep the state at the end of each input: on in a
                 server (clients re-render replies), off for traces that resend them verbatim
    ghost_tokens token ids of finished requests the 'jenga' admission remembers (0: off)
    lock_prefix  False: an insert may evict the request's own cached prefix, as Marconi's
                 reference simulator does (radix/cache.py `serve`); only sequential serving
                 reads it, an engine always holds the prefix it computes on
    """

    admission: Admission = "jenga"
    eviction: Eviction = "jenga"
    alpha: float | None = None
    tuner: Tuner = "sliding"
    prompt_end: bool = False
    ghost_tokens: int = GHOST_TOKENS
    lock_prefix: bool = True

    def __post_init__(self) -> None:
        for value, known, what in (
            (self.admission, ADMISSIONS, "admission"),
            (self.eviction, EVICTIONS, "eviction"),
            (self.tuner, TUNERS, "tuner"),
        ):
            if value not in known:
                raise ValueError(f"unknown {what} {value!r}; known: {', '.join(known)}")
        if self.alpha is not None and not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0 or None (auto), got {self.alpha}")
        if self.ghost_tokens < 0:
            raise ValueError(f"ghost_tokens must be >= 0, got {self.ghost_tokens}")

    @property
    def tuned(self) -> bool:
        """Whether a tuner runs: alpha is 'auto' and the eviction reads it."""
        return self.alpha is None and self.eviction != "lru" and self.tuner != "none"


#: The named bundles, with what each one is for.
BUNDLES: dict[str, tuple[PolicyRecord, str]] = {
    "vllm-blocks": (
        PolicyRecord("every-block", "lru", tuner="none"),
        "every-block admission (B=32) + LRU",
    ),
    "sglang-lru": (
        PolicyRecord("speculative", "lru", tuner="none"),
        "speculative admission + LRU (SGLang+)",
    ),
    "sglang-lru-faithful": (
        PolicyRecord("speculative-sequence", "lru", tuner="none", lock_prefix=False),
        "sglang-lru as the reference simulator's SGLang+ runs it: the branch checkpoint where "
        "input + output leaves the tree, the request's own prefix a candidate while its insert "
        "evicts; sequential simulation only",
    ),
    "marconi": (
        PolicyRecord("speculative", "marconi", tuner="marconi", lock_prefix=False),
        "speculative admission + Marconi's eviction as the reference computes it (1 / age "
        "recency, efficiency per byte of the whole path) + one-shot tuning on the reference's "
        "schedule",
    ),
    "marconi-faithful": (
        PolicyRecord("speculative-sequence", "marconi", tuner="marconi", lock_prefix=False),
        "marconi with the reference simulator's branch checkpoint: where input + output leaves "
        "the tree, which may lie in the output (policies/README.md row 17); sequential "
        "simulation only, a server checkpoints during prefill",
    ),
    "marconi-linear": (
        PolicyRecord("speculative", "flop-aware", tuner="marconi"),
        "marconi as it was before the comparison with the reference simulator: our earlier "
        "eviction terms (min-max of the last access, efficiency per byte the node holds; "
        "policies/eviction.py) and the request's prefix locked",
    ),
    "marconi-postevict": (
        PolicyRecord("speculative", "marconi", tuner="marconi-postevict", lock_prefix=False),
        "marconi with our earlier tuning schedule: window of N requests after the first "
        "eviction, replayed from the cache at that eviction, scored whole",
    ),
    "jenga": (
        PolicyRecord("jenga", "jenga", tuner="sliding"),
        "speculative admission (no checkpoints at short branches) + FLOP-aware eviction that "
        "drops superseded checkpoints first + sliding re-tuning",
    ),
}


def bundle_names() -> list[str]:
    """Every name `bundle` accepts, the alpha-fixed marconi spelled as its pattern."""
    return [*BUNDLES, "marconi@<alpha>"]


def bundle(name: str) -> PolicyRecord:
    """The record of a named bundle; `marconi@A` is Marconi's bundle with alpha fixed to A (no
    tuning), the building block of the per-configuration hindsight oracle."""
    base, sep, alpha_text = name.partition("@")
    if sep and base == "marconi":
        try:
            alpha = float(alpha_text)
        except ValueError:
            raise ValueError(f"bad alpha in policy {name!r}: expected marconi@<float>") from None
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"bad alpha in policy {name!r}: alpha must be >= 0")
        return PolicyRecord("speculative", "marconi", alpha, "none", lock_prefix=False)
    try:
        return BUNDLES[name][0]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(bundle_names())}") from None
