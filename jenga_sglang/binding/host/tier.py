"""The live host tier under the backend's tree (`--jenga-host-gb`): built here, and the two
places the backend's request path meets it.

* **Load-back at admission** (`load_hit`): the match SGLang makes when it admits a request
  (`init_next_round_input`: `cow_mamba` on a Mamba model) runs the tier's `prepare`
  (radix/host_load.py): when loading the hit's host part beats recomputing it, every host node
  on the request's walk moves to device slots the engine allocates, bytes included, and the
  match covers it. Not when the pass's admission budget refuses the request even so
  (binding/pools/budget.py `surely_refuses`): the loaded nodes would wait unlocked, and could
  go back to host before the request is admitted. The scheduler's other matches (the waiting
  queue's priority probes) see the device hit only and move nothing, so a request that waits
  loads nothing until it is admitted.
  SGLang is told nothing of the host: to it the loaded tokens are a device hit
  (`host_hit_length` stays 0, and HiCache's `init_load_back` path never runs).
* **An insert's path** (radix/host.py `clear_walk`, called by slots/tree.py): between the match
  and a request's insert, eviction may move unlocked nodes of its path past the hit back to
  host. The request brings its own KV for those tokens, so the host copies on the path are
  dropped before the tree adopts them.

Refused at start-up, with the flag named: sliding-window models (the window pool's slots), int8
checkpoints (states in SGLang's checkpoint pool) and `--page-size` > 1 (a load-back allocates
token slots, not pages), which this first version does not cover.
"""

from __future__ import annotations

from typing import Any

from jenga_sglang.binding.host.copies import SglangHostCopies
from jenga_sglang.binding.host.memory import HostSlotMemory
from jenga_sglang.binding.options import JengaOptions
from jenga_sglang.binding.slots.sglang_slots import SglangSlots
from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.host import FlopAwareTier, tier_layers
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.host import HostTier
from jenga_sglang.radix.match import MatchResult, Walk
from jenga_sglang.radix.tokens import TokenSeq

GB = 1e9


def attach_live_tier(
    cache: PrefixCache, slots: SglangSlots, spec: ModelSpec, options: JengaOptions
) -> HostTier | None:
    """The host tier `options` ask for under `cache` (None with `--jenga-host-gb 0`)."""
    if options.host_gb <= 0:
        return None
    if slots.window is not None:
        raise NotImplementedError(
            f"--jenga-host-gb: {spec.name} has a sliding-window pool, whose slots the host "
            "tier does not copy yet; serve it without --jenga-host-gb"
        )
    if int(getattr(slots.allocator, "page_size", 1)) > 1:
        raise NotImplementedError(
            "--jenga-host-gb is served with --page-size 1 only: a load-back allocates token "
            "slots one by one, not whole pages, so far"
        )
    if slots.checkpoints is not None:
        raise NotImplementedError(
            "--jenga-host-gb conflicts with --enable-int8-mamba-checkpoint: the host tier "
            "copies live Mamba slots, not SGLang's int8 checkpoint pool; drop one of the two"
        )
    sizes = {t: slots.memory.page_bytes(t) for t in slots.memory.page_types}
    memory = HostSlotMemory(int(options.host_gb * GB), sizes)
    copies = SglangHostCopies(slots.allocator.get_kvcache(), slots.req_to_token_pool, memory)
    policy = FlopAwareTier(
        cache.tree.policy, options.host_bw * GB, options.prefill_tflops * 1e12, tier_layers(spec)
    )
    return cache.attach_host(memory, policy, copies)


def admits(params: Any, has_state: bool) -> bool:
    """Whether this match is the one SGLang admits the request on (module docstring); a
    model without Mamba layers has no such mark, so each of its requests' matches loads."""
    return params.req is not None and (bool(params.cow_mamba) or not has_state)


def load_hit(
    cache: PrefixCache,
    host: HostTier,
    tokens: TokenSeq,
    found: MatchResult,
    namespace: str | None,
) -> tuple[MatchResult, int]:
    """The match after the tier loaded what it decided to, and the tokens of it loaded."""
    whole = len(tokens) - len(tokens) % cache.tree.page
    prepared = host.prepare(cache, tokens, found.walk, whole, namespace)
    if prepared is None:
        return found, 0
    _, matched, loaded = prepared
    return matched, loaded.host_hit


def device_only(cache: PrefixCache, found: MatchResult) -> MatchResult:
    """`found` cut where its path reaches host memory: a match that loads nothing must not
    hand SGLang host pages (the tree's own match counts a host node's KV as held, which only a
    model without Mamba layers, whose hits need no checkpoint, reaches)."""
    path = found.walk.path
    first = next((i for i, n in enumerate(path) if n.host), None)
    if first is None:
        return found
    return cache.tree.match_walk(Walk(min(found.walk.length, path[first].start), path[:first]))


def host_counters(host: HostTier | None, hit_tokens: int, deferred: int) -> dict[str, Any]:
    """The tier's fields of the backend's metrics snapshot (binding/cache/metrics.py)."""
    if host is None:
        return {}
    copies = host.copies
    assert isinstance(copies, SglangHostCopies)
    memory = host.memory
    held = {
        (f"host {t}", "evictable"): memory.usage(t).evictable * memory.page_bytes(t)
        for t in memory.page_types
    }
    return {
        "host_hit_tokens": hit_tokens,
        "host_loads_deferred": deferred,
        "host_stored_bytes": copies.stored_bytes,
        "host_loaded_bytes": copies.loaded_bytes,
        "host_bytes": held,
    }
