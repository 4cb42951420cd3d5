"""How far can any policy get above LRU on a multi-session trace? Session-level bounds.

A session-level model of the cache: after each request its session holds what the model
says, and nothing else is cached (no dead tails, no wasted states). A request whose session
is held hits what it hits in an unbounded cache (the ceiling of speculative admission); one
whose session is not held hits at most the shared prefix (`shared` tokens). A session holds

* `whole`: its last sequence (input + output KV) plus two states (branch point and end), or
* `live`: only the prefix its next request can resume from, up to the point where its last
  request left the sequence before it, plus that one state: what a cache that knows where
  requests branch (the ghost) and drops what a rewrite will replace (expendable tails)
  would hold.

Under a byte budget the model evicts whole sessions, either `lru` (least recently served
first: an online rule; with memoryless gaps between a session's requests, evicting at random
does about as well) or `belady` (the session whose next request is furthest in the future:
clairvoyant).

The gap between the tree's LRU and session `lru` is what removing waste can buy online; the
gap up to `belady` needs knowledge of the future. Also counts, for the tree's `sglang-lru`,
how many misses follow a miss of the same session (one eviction costing two requests).

    jenga-bench agent-bounds data/traces/agent-e65e885ce70e.jsonl.gz 5,10,20,40
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from jenga_sglang.bench.runs.runner import load_packed
from jenga_sglang.bench.traces.packed import PackedRequest
from jenga_sglang.models.presets import marconi_7b
from jenga_sglang.policies.bundles import build_cache, byte_budget
from jenga_sglang.radix.tokens import TokenSeq

UNBOUNDED = 10**15


def per_request_hits(reqs: Sequence[PackedRequest], policy: str, cache_bytes: int) -> list[int]:
    spec = marconi_7b()
    cache, tuner = build_cache(policy, spec, byte_budget(spec, cache_bytes))
    hits = []
    for i, r in enumerate(reqs):
        hits.append(cache.serve(r.inp, r.out, owner=i).hit_tokens)
        if tuner is not None:
            tuner.after_request(cache, r.inp, r.out)
    return hits


def held_bytes(reqs: Sequence[PackedRequest], hold: str) -> list[int]:
    """Bytes each request's session holds after it, under `hold` (see the module doc)."""
    spec = marconi_7b()
    if hold == "whole":
        return [
            (len(r.inp) + len(r.out)) * spec.kv_bytes_per_token + 2 * spec.state_bytes for r in reqs
        ]
    previous: dict[int, TokenSeq] = {}
    out = []
    for r in reqs:
        before = previous.get(r.session_id)
        branch = before.common_prefix(r.inp) if before is not None else 0
        out.append(branch * spec.kv_bytes_per_token + spec.state_bytes)
        previous[r.session_id] = r.inp.concat(r.out)
    return out


def session_model(
    reqs: Sequence[PackedRequest],
    ceiling: Sequence[int],
    cache_bytes: int,
    rule: str,
    shared: int,
    hold: str = "whole",
) -> float:
    next_use = [0] * len(reqs)
    seen: dict[int, int] = {}
    for i in range(len(reqs) - 1, -1, -1):
        next_use[i] = seen.get(reqs[i].session_id, len(reqs))
        seen[reqs[i].session_id] = i
    size = held_bytes(reqs, hold)
    held: dict[int, int] = {}  # session -> bytes
    key: dict[int, int] = {}  # session -> last served (lru) or next request (belady)
    hit = 0
    for i, r in enumerate(reqs):
        s = r.session_id
        hit += ceiling[i] if s in held else min(ceiling[i], shared)
        held[s] = size[i]
        key[s] = i if rule == "lru" else -next_use[i]
        total = sum(held.values())
        while total > cache_bytes and len(held) > 1:
            victim = min((k for k in held if k != s), key=key.__getitem__)
            total -= held.pop(victim)
    return hit / sum(len(r.inp) for r in reqs)


def misses_after_misses(
    reqs: Sequence[PackedRequest], ceiling: Sequence[int], hits: Sequence[int]
) -> tuple[int, int]:
    """(misses that follow a miss of the same session, all misses); miss = below the ceiling."""
    last: dict[int, bool] = {}
    chained = total = 0
    for r, c, h in zip(reqs, ceiling, hits, strict=True):
        miss = h < c
        total += miss
        chained += miss and last.get(r.session_id, False)
        last[r.session_id] = miss
    return chained, total


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("cache_gb", help="comma-separated sizes in GB (1e9 bytes)")
    ap.add_argument("--shared", type=int, default=400, help="tokens every request shares")
    args = ap.parse_args(argv)
    reqs = load_packed(args.trace)
    total = sum(len(r.inp) for r in reqs)
    ceiling = per_request_hits(reqs, "sglang-lru", UNBOUNDED)
    print(f"ceiling {sum(ceiling) / total:.4f}")
    print("GB  tree-lru  session-lru  session-belady  live-lru  live-belady  misses-after-miss")
    for gb in (float(x) for x in args.cache_gb.split(",")):
        size = int(gb * 1e9)
        tree = per_request_hits(reqs, "sglang-lru", size)
        chained, misses = misses_after_misses(reqs, ceiling, tree)
        models = [
            session_model(reqs, ceiling, size, rule, args.shared, hold)
            for hold in ("whole", "live")
            for rule in ("lru", "belady")
        ]
        figures = "  ".join(f"{m:.4f}" for m in models)
        print(f"{gb:g}  {sum(tree) / total:.4f}  {figures}  {chained}/{misses}", flush=True)


if __name__ == "__main__":
    main()
