"""One `jenga-bench` run whose cache is SGLang's own stack (`--policy sglang-native...`).

bench/runner.py hands these policy names here; this module turns a RunConfig into the same
flat record as every other run, plus the SGLang pool sizes. Importing it is cheap: sglang is
only imported when the cache is built.
"""

from __future__ import annotations

from typing import Any

from jenga_sglang.bench.replay import PackedRequest
from jenga_sglang.bench.sglang_split import static_split
from jenga_sglang.models.spec import ModelSpec

NATIVE_POLICIES = ("sglang-native", "sglang-native-unified")
VIA = ("", "sglang")
VIA_POLICIES = ("jenga",)  # our policies that JengaOptions' defaults express


def validate_native(policy: str, mode: str, memory: str, via: str = "") -> None:
    """ValueError naming the field when a run through SGLang asks for what it does not model."""
    if via not in VIA:
        raise ValueError(f"unknown --via {via!r}; known: sglang")
    known = VIA_POLICIES if via else NATIVE_POLICIES
    if policy not in known:
        what = "--via sglang policy" if via else "SGLang policy"
        raise ValueError(f"unknown {what} {policy!r}; known: {', '.join(known)}")
    if mode != "sequential":
        raise ValueError(f"policy {policy!r} supports mode 'sequential' only, got {mode!r}")
    if memory != "bytes":
        raise ValueError(f"policy {policy!r} sizes SGLang's own pools; --memory must be 'bytes'")


NO_TREE_FIELDS = {"alpha": 0.0, "tunings": 0, "evicted_nodes": 0, "evicted_states": 0}


def _our_tree_fields(backend: Any) -> dict[str, Any]:
    """The fields a pure replay reports about our tree, read off the backend (`--via`)."""
    cache = backend.cache
    return {
        "alpha": float(getattr(backend.cache.eviction, "alpha", 0.0)),
        "tunings": backend.tuner.log.tunings if backend.tuner is not None else 0,
        "evicted_nodes": cache.evicted_nodes,
        "evicted_states": cache.evicted_states,
    }


def run_native(
    policy: str,
    requests: list[PackedRequest],
    spec: ModelSpec,
    cache_bytes: int,
    chunk_tokens: int,
    via: str = "",
) -> dict[str, Any]:
    """Replay `requests` through SGLang's cache, or (`via="sglang"`) through our backend on
    SGLang's unified pool; the record fields runner.run adds to its own."""
    from jenga_sglang.bench.sglang_native import replay_native

    split = static_split(spec, cache_bytes)
    unified = via == "sglang" or policy == "sglang-native-unified"
    tree = "jenga" if via else "sglang"
    stats, cache = replay_native(requests, spec, split, chunk_tokens, unified, tree)
    return {
        **stats.fields(),
        "peak_bytes": split.kv_bytes + split.mamba_bytes,
        "capacity_violations": 0,
        **(_our_tree_fields(cache.tree_cache) if via else NO_TREE_FIELDS),
        "via": via,
        "sglang_kv_tokens": split.kv_tokens,
        "sglang_mamba_slots": split.mamba_slots,
        "sglang_kv_capacity": cache.kv_capacity,
        **{f"sglang_end_{k}": v for k, v in cache.usage().items()},
    }
