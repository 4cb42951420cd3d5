"""One `jenga-bench` run through SGLang: its own cache (`--cache sglang-native[-unified]`) or ours
as its cache backend (`--cache jenga --via sglang`, any bundle).

bench/runs/runner.py hands such runs here; this module turns a RunConfig into the same flat
record as every other run, plus the SGLang pool sizes. Importing it is cheap: sglang is only
imported when the cache is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI reads the cache names here before it needs anything else
    from jenga_sglang.bench.traces.packed import PackedRequest
    from jenga_sglang.models.spec import ModelSpec
    from jenga_sglang.policies.registry import PolicyRecord

OURS = "jenga"
HICACHE = "sglang-native-hicache"  # with its host tier (bench/drivers/sglang_hicache.py)
NATIVE_CACHES = ("sglang-native", "sglang-native-unified", HICACHE)
CACHES = (OURS, *NATIVE_CACHES)
VIA = ("", "sglang")


def validate_sglang(cache: str, policy: str, mode: str, memory: str, via: str = "") -> None:
    """ValueError naming the option when a run through SGLang asks for what it does not model."""
    if via not in VIA:
        raise ValueError(f"unknown --via {via!r}; known: sglang")
    if cache in NATIVE_CACHES:
        if via:
            raise ValueError(
                f"--via sglang drives our cache through SGLang; --cache {cache} is SGLang's own"
            )
        if policy:
            raise ValueError(
                f"--cache {cache} runs SGLang's own LRU; --policy {policy!r} needs --cache {OURS}"
            )
    what = f"--cache {cache}" if cache in NATIVE_CACHES else "--via sglang"
    if mode != "sequential":
        raise ValueError(f"{what} supports --mode sequential only, got {mode!r}")
    if memory != "bytes":
        raise ValueError(
            f"{what} sizes SGLang's own pools; --memory must be 'bytes', got {memory!r}"
        )


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


def run_sglang(
    cache: str,
    policy: PolicyRecord | None,
    requests: list[PackedRequest],
    spec: ModelSpec,
    cache_bytes: int,
    chunk_tokens: int,
) -> dict[str, Any]:
    """Replay `requests` through SGLang's cache `cache`, or (`cache="jenga"`) through our backend
    running `policy` on SGLang's unified pool; the record fields runner.run adds to its own."""
    from jenga_sglang.bench.drivers.sglang_native import replay_native
    from jenga_sglang.bench.drivers.sglang_split import static_split

    split = static_split(spec, cache_bytes)
    ours = cache == OURS
    unified = ours or cache == "sglang-native-unified"
    tree = "jenga" if ours else "sglang"
    stats, native = replay_native(requests, spec, split, chunk_tokens, unified, tree, policy)
    return {
        **stats.fields(),
        "peak_bytes": split.kv_bytes + split.mamba_bytes,
        "capacity_violations": 0,
        **(_our_tree_fields(native.tree_cache) if ours else NO_TREE_FIELDS),
        "via": "sglang" if ours else "",
        "sglang_kv_tokens": split.kv_tokens,
        "sglang_mamba_slots": split.mamba_slots,
        "sglang_kv_capacity": native.kv_capacity,
        **{f"sglang_end_{k}": v for k, v in native.usage().items()},
    }
