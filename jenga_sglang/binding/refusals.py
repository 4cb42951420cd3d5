"""SGLang flags `--enable-jenga` refuses at start-up, each with the reason the message gives,
and those the Jenga pool stands in for (`POOL_STANDS_IN`: dropped with a warning).

docs/sglang.md ("Refused flags") lists the same tables; tests/test_binding_plugin.py checks
that every refusal fails with its flag and reason and every stand-in is dropped naming its
flag, and tests/test_docs_refusals.py that the docs list exactly these flags.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    """SGLang's flag `flag` (namespace attribute `attr`) is refused when its value is not
    `unset` (nor None, nor one of `allowed`, compared case-blind); `reason` says why, in one
    clause."""

    attr: str
    flag: str
    reason: str
    unset: object = False
    allowed: tuple[str, ...] = ()

    def given(self, args: argparse.Namespace) -> bool:
        value = getattr(args, self.attr, self.unset)
        if value in (self.unset, None):
            return False
        return not (isinstance(value, str) and value.upper() in self.allowed)


#: Speculative algorithms without a draft model: their verify scratch sits beside the pool
#: (binding/pools/sglang_pool.py `add_verify_scratch`).
DRAFTLESS_SPECULATIVE: tuple[str, ...] = ("NGRAM",)
#: Algorithms whose draft model's KV joins the target's KV pages (binding/pools/draft.py), on
#: a hybrid Mamba model's pool; those tested on this machine (docs/sglang.md). NEXTN is the
#: flag's name for a model's own MTP layers (SGLang runs them as EAGLE).
DRAFT_IN_POOL_SPECULATIVE: tuple[str, ...] = ("STANDALONE", "EAGLE", "NEXTN")
POOL_SPECULATIVE = DRAFTLESS_SPECULATIVE + DRAFT_IN_POOL_SPECULATIVE


def pool_refuses_speculation(algorithm: object, *, draft_in_pool: bool) -> bool:
    """Whether a pool refuses SGLang's resolved speculative algorithm (`draft_in_pool`: the
    pool lays out a draft model's KV)."""
    served = POOL_SPECULATIVE if draft_in_pool else DRAFTLESS_SPECULATIVE
    return algorithm is not None and _name(algorithm) not in served


def _name(algorithm: object) -> str:
    """SGLang's enum member or its name, as the flag spells it."""
    return str(getattr(algorithm, "name", algorithm)).upper()


#: Refused with our cache at all: each selects another cache or a feature built on SGLang's own.
WITH_JENGA: tuple[Refusal, ...] = (
    Refusal(
        "disable_radix_cache",
        "--disable-radix-cache",
        "it turns prefix caching off, which is what --enable-jenga does; drop one of the two",
    ),
    Refusal(
        "enable_lmcache",
        "--enable-lmcache",
        "the scheduler drives LMCache's store and retrieve through SGLang's "
        "LMCacheUnifiedRadixCache, which our tree is not",
    ),
    Refusal(
        "enable_flexkv",
        "--enable-flexkv",
        "FlexKV serves its host hits through its own FlexKVRadixCache; our tree has no FlexKV "
        "connector",
    ),
    Refusal(
        "enable_unified_cache_external_linker",
        "--enable-unified-cache-external-linker",
        "the linker attaches external stores to UnifiedRadixCache's components; our cache is "
        "not one",
    ),
)

#: Refused with the Jenga pool (on by default; `--no-jenga-pool` lifts these): each lays out
#: memory in a way the pool's views are not checked against, or needs a page type the pool
#: does not have.
WITH_POOL: tuple[Refusal, ...] = (
    Refusal(
        "enable_page_major_kv_layout",
        "--enable-page-major-kv-layout",
        "the pool's KV views are slot-strided, and only the triton and torch_native attention "
        "backends are checked on them",
    ),
    Refusal(
        "speculative_algorithm",
        "--speculative-algorithm",
        "only NGRAM, STANDALONE, EAGLE and NEXTN run over the pool: EAGLE3 is not tested on it "
        "(NemotronH, the model it is tested with, captures no auxiliary hidden states), and "
        "DFLASH-family drafts keep pools of their own",
        None,
        POOL_SPECULATIVE,
    ),
)


class StandIn(Refusal):
    """A flag asking SGLang for what the Jenga pool already does: with the pool on it is set
    back to `unset` and a warning gives `reason` (a launch script that has it needs no
    change); with `--no-jenga-pool` SGLang serves it."""


#: Both ask SGLang not to split its memory statically between KV and Mamba states, which the
#: pool does by construction (large pages carved into either on demand).
POOL_STANDS_IN: tuple[StandIn, ...] = (
    StandIn(
        "enable_unified_memory",
        "--enable-unified-memory",
        "SGLang's unified memory lets KV and Mamba states share one buffer; the Jenga pool "
        "does so, carving pages on demand, and takes its place (--no-jenga-pool for SGLang's)",
    ),
    StandIn(
        "mamba_full_memory_ratio",
        "--mamba-full-memory-ratio",
        "it sizes SGLang's static KV / state split, which the Jenga pool replaces by carving "
        "pages on demand, so it does not apply (--no-jenga-pool keeps the split)",
        None,
    ),
)


def refusal_message(prefix: str, refusal: Refusal) -> str:
    return f"{prefix} conflicts with {refusal.flag}: {refusal.reason}"


def stand_in_message(stand_in: StandIn) -> str:
    return f"jenga: {stand_in.flag} is dropped with the Jenga pool on: {stand_in.reason}"
