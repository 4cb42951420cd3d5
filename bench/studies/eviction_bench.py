"""Eviction throughput: evictions per second against the tree size.

Marconi's reference rescans every node for each eviction (O(N) per victim). Our FLOP-aware policy
keeps candidates in two sorted orders and finds the minimum-utility victim with Fagin's threshold
algorithm. This benchmark builds a tree of N leaves (each a distinct prompt with an SSM
checkpoint, random lengths and access times, marconi-7b spec), then times K evictions through
the tree's evictor callback for each policy, and for a full-scan baseline that computes the same
argmin by scanning every candidate (what the reference does).

    jenga-bench eviction --nodes 10000,100000 --evictions 2000 [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence

from jenga_sglang.models.presets import get_spec
from jenga_sglang.policies.admission import SpeculativeAdmission
from jenga_sglang.policies.bundles import byte_budget
from jenga_sglang.policies.eviction import FlopAwareEviction, LruEviction
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.contracts import EvictionPolicy
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.tokens import TokenSeq


class FullScanFlopAware(FlopAwareEviction):
    """The reference's method: score every candidate for every eviction (for comparison)."""

    def victim(self) -> Node | None:
        nodes = [node for _, node in self._by_recency.ascending()]
        if not nodes:
            return None
        return min(nodes, key=lambda n: (self.utility(n), n.id))


POLICIES: dict[str, Callable[[], EvictionPolicy]] = {
    "lru": LruEviction,
    "flop-aware": lambda: FlopAwareEviction(alpha=1.0),
    "flop-aware-full-scan": lambda: FullScanFlopAware(alpha=1.0),
}


def build(nodes: int, policy: EvictionPolicy, seed: int) -> PrefixCache:
    spec = get_spec("marconi-7b")
    cache = PrefixCache(spec, byte_budget(spec, 10**15), policy, SpeculativeAdmission())
    rng = random.Random(seed)
    for i in range(nodes):
        key = TokenSeq.of([i + 1] + [rng.randrange(32_000) for _ in range(rng.randrange(8, 64))])
        cache.serve(key, TokenSeq.of([7]), owner=i)
    return cache


def time_evictions(cache: PrefixCache, evictions: int) -> float:
    """Evictions per second through the tree's evictor callback."""
    kv = cache.kv_types[0]
    start = time.perf_counter()
    for _ in range(evictions):
        if not cache.evict(kv):
            raise RuntimeError("ran out of victims: build a larger tree")
    return evictions / (time.perf_counter() - start)


def run(sizes: Sequence[int], evictions: int, policies: Sequence[str], seed: int) -> list[dict]:  # type: ignore[type-arg]
    rows = []
    for nodes in sizes:
        for name in policies:
            cache = build(nodes, POLICIES[name](), seed)
            count = evictions if name != "flop-aware-full-scan" else max(20, evictions // 50)
            rate = time_evictions(cache, count)
            cache.check_integrity()
            rows.append(
                {
                    "policy": name,
                    "nodes": nodes,
                    "evictions": count,
                    "evictions_per_s": round(rate, 1),
                }
            )
            print(f"{name:>22} {nodes:>8} nodes: {rate:10.0f} evictions/s", file=sys.stderr)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="10000,100000")
    parser.add_argument("--evictions", type=int, default=2000)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    names = args.policies.split(",")
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        parser.error(f"unknown policies {unknown}; known: {list(POLICIES)}")
    sizes = [int(n) for n in args.nodes.split(",")]
    rows = run(sizes, args.evictions, names, args.seed)
    if args.json:
        print(json.dumps(rows))
    else:
        print("| policy | nodes | evictions/s |\n|---|---:|---:|")
        for r in rows:
            print(f"| {r['policy']} | {r['nodes']} | {r['evictions_per_s']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
