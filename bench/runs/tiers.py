"""What a run with a host-memory tier adds (docs/host-tier.md): where `--host-gb` runs, the
estimated time to first token with load-back, and the record's tier fields.

bench/runs/runner.py builds the tier (policies/bundles.py `build_cache`, `HostSpec`) and calls
these; SGLang's HiCache baseline records the same fields from its own cache."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from jenga_sglang.bench.drivers.sglang_hicache import WRITE_POLICIES
from jenga_sglang.bench.drivers.sglang_run import HICACHE
from jenga_sglang.bench.simulation.cost_model import CostModel
from jenga_sglang.policies.host import tier_layers
from jenga_sglang.radix.host import HostTier

if TYPE_CHECKING:
    from jenga_sglang.bench.traces.packed import PackedRequest
    from jenga_sglang.models.spec import ModelSpec

#: the caches under test that have a host tier: ours, and SGLang's HiCache
HOST_CACHES = ("jenga", HICACHE)


def validate_host(
    host_gb: float, host_bw: float, cache: str, mode: str, via: str, locks_prefix: bool
) -> None:
    """ValueError naming the flag when the tier's sizes are bad or it is asked where it does
    not run yet: our cache (`cache` "jenga") runs it in the sequential replay of a bundle that
    locks the request's prefix (`locks_prefix`) only."""
    if not (math.isfinite(host_gb) and host_gb >= 0):
        raise ValueError(f"--host-gb must be a number of GB >= 0, got {host_gb}")
    if not (math.isfinite(host_bw) and host_bw > 0):
        raise ValueError(f"--host-bw must be a positive number of GB/s, got {host_bw}")
    if host_gb == 0:
        return
    if cache not in HOST_CACHES:
        raise ValueError(f"--host-gb applies to --cache {' or '.join(HOST_CACHES)}, not {cache}")
    if cache != "jenga":
        return
    if mode != "sequential" or via:
        raise ValueError("--host-gb runs in the sequential replay of --cache jenga only so far")
    if not locks_prefix:
        raise ValueError(
            "--host-gb needs a bundle that locks the request's prefix; the reference "
            "simulator's unlocked insert (marconi, -faithful) may demote it mid-insert"
        )


def first_token(
    cost: CostModel, flops: Callable[[int], float], layers: int, bandwidth: float
) -> Callable[[int, int, int], float]:
    """Estimated time to first token of a request of n input tokens that hit `hit` tokens and
    loaded `load` bytes from host (CostModel.first_token_seconds; docs/host-tier.md)."""

    def ttft(n: int, hit: int, load: int) -> float:
        return cost.first_token_seconds(flops(n) - flops(hit), load / bandwidth, layers)

    return ttft


def host_fields(host: HostTier) -> dict[str, int]:
    """What moved between the tiers: demotions, host evictions, host memory's peak."""
    return {
        "host_demoted_nodes": host.demoted_nodes,
        "host_demoted_states": host.demoted_states,
        "host_dropped_nodes": host.dropped_nodes,
        "host_dropped_states": host.dropped_states,
        # demoted onto a clean copy a load-back left (radix/host_copy.py): not written again
        "host_kept_bytes": host.kept_bytes,
        # loaded bytes that a live tier would leave on host (radix/host_load.py)
        "host_load_past_bytes": host.past_bytes,
        "host_peak_bytes": int(getattr(host.memory, "peak_bytes", host.memory.held_bytes())),
    }


def validate_hicache(cache: str, host_gb: float, write_policy: str) -> None:
    """SGLang's HiCache needs a host size and one of its write policies."""
    if write_policy not in WRITE_POLICIES:
        raise ValueError(
            f"unknown --hicache-write-policy {write_policy!r}; known: {', '.join(WRITE_POLICIES)}"
        )
    if cache == HICACHE and host_gb <= 0:
        raise ValueError(f"--cache {HICACHE} needs its host size: --host-gb G (or Rx)")


def run_hicache(
    requests: Sequence[PackedRequest],
    spec: ModelSpec,
    cost: CostModel,
    cache_bytes: int,
    host_bytes: int,
    chunk_tokens: int,
    host_bw: float,
    write_policy: str,
) -> dict[str, Any]:
    """Replay through SGLang's HiCache (bench/drivers/sglang_hicache.py) on the static split of
    `cache_bytes`, host pools `host_bytes / cache_bytes` times the device's; the record's
    fields, with the per-request times to first token under "ttfts"."""
    from jenga_sglang.bench.drivers.sglang_hicache import replay_hicache
    from jenga_sglang.bench.drivers.sglang_split import static_split

    split = static_split(spec, cache_bytes)
    ratio = host_bytes / cache_bytes
    ttft = first_token(cost, spec.flops, tier_layers(spec), host_bw * 10**9)
    stats, native = replay_hicache(requests, spec, split, chunk_tokens, ratio, write_policy, ttft)
    return {
        **stats.fields(),
        "ttfts": stats.ttfts,
        "peak_bytes": split.kv_bytes + split.mamba_bytes,
        "capacity_violations": 0,
        "alpha": 0.0,
        "tunings": 0,
        "evicted_nodes": 0,
        "evicted_states": 0,
        "via": "",
        "hicache_write": write_policy,
        "sglang_kv_tokens": split.kv_tokens,
        "sglang_mamba_slots": split.mamba_slots,
        "sglang_kv_capacity": native.kv_capacity,
        **native.host_usage(),
        **{f"sglang_end_{k}": v for k, v in native.usage().items()},
    }
