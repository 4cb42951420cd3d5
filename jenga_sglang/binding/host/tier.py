"""The live host tier under the backend's tree (`--jenga-host-gb`): built here, and the two
places the backend's request path meets it.

* **Load-back after admission** (SGLang's own contract for a host hit). Every match of a
  request reports the hit the tier offers past the device one (`offered`: radix/host_load.py
  `offer`, the tier policy's load-or-recompute decision, nothing moved) as SGLang's
  `host_hit_length`. PrefillAdder then budgets those tokens as KV the request needs, and only
  once it admits the request calls the backend's `init_load_back`, which runs the tier's
  `prepare` (`load_hit`): every host node on the request's walk moves to device slots the
  engine allocates, bytes included, and the request resumes past it. A request the budget
  refuses loads nothing, so a waiting queue does not load hits that are demoted again before
  they run. To SGLang the loaded tokens are then part of the prefix it locks and reports as
  cached. On the Jenga pool a load that brings a checkpoint also asks the pass's budget
  whether the state's room fits (binding/pools/budget.py `fits_loaded_state`: SGLang reserves
  none for it); where it does not, nothing is loaded and SGLang admits the request without
  its host hit.
* **An insert's path** (radix/host.py `clear_walk`, called by slots/tree.py): between the match
  and a request's insert, eviction may move unlocked nodes of its path past the hit back to
  host. The request brings its own KV for those tokens, so the host copies on the path are
  dropped before the tree adopts them.

With `--enable-int8-mamba-checkpoint` the tree's states are slots of SGLang's int8 checkpoint
pool: they go to host and come back quantized (binding/host/copies.py), into checkpoint slots.
A sliding-window model's window pages go with their node and come back into fresh SWA slots,
which the match reports as SGLang's `swa_host_hit_length` (its SWA budget reserves them) and
the load points the fresh full slots at (slots/tree.py `loaded`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from jenga_sglang.binding.host.copies import SglangHostCopies, kv_buffers
from jenga_sglang.binding.host.memory import HostSlotMemory
from jenga_sglang.binding.options import JengaOptions
from jenga_sglang.binding.slots.sglang_slots import SglangSlots
from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.host import FlopAwareTier, tier_layers
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.host import HostTier
from jenga_sglang.radix.host_load import offer
from jenga_sglang.radix.match import MatchResult, Walk
from jenga_sglang.radix.tokens import TokenSeq

GB = 1e9


class HostHit(NamedTuple):
    """SGLang's `best_match_node` of a match that offers a host hit: the match's parameters,
    which `init_load_back` matches again, loading."""

    params: Any


class Offer(NamedTuple):
    """A host hit as SGLang's match reports it (`host_hit_length`, `mamba_host_hit_length`,
    `swa_host_hit_length`)."""

    tokens: int  # past the device hit
    state: bool  # the state the hit resumes from is on host
    window: int = 0  # SWA slots the load takes: the window pages of the walk's host nodes


def attach_live_tier(
    cache: PrefixCache, slots: SglangSlots, spec: ModelSpec, options: JengaOptions
) -> HostTier | None:
    """The host tier `options` ask for under `cache` (None with neither a size nor a ratio)."""
    if options.host_gb <= 0 and options.host_ratio <= 0:
        return None
    sizes = {t: slots.memory.page_bytes(t) for t in slots.memory.page_types}
    buffers = kv_buffers(slots.allocator.get_kvcache(), slots.kv_type, slots.window_type)
    if options.host_gb > 0:
        budget = int(options.host_gb * GB)
    else:
        budget = int(options.host_ratio * device_pool_bytes(buffers, slots.req_to_token_pool))
    memory = HostSlotMemory(budget, sizes)
    copies = SglangHostCopies(buffers, slots.req_to_token_pool, memory, slots.checkpoints)
    policy = FlopAwareTier(
        cache.tree.policy, options.host_bw * GB, options.prefill_tflops * 1e12, tier_layers(spec)
    )
    return cache.attach_host(memory, policy, copies)


def device_pool_bytes(buffers: dict[Any, list[Any]], req_to_token_pool: Any) -> int:
    """Device bytes behind the cache's pools: the KV buffers and the Mamba pool's states (conv
    and temporal; not its speculative scratch), each storage once (a layer's K and V, and the
    Jenga pool's views, share one). What `--hicache-ratio` multiplies, as SGLang's HiCache
    sizes its host pools from the device's."""
    tensors = [t for per_type in buffers.values() for t in per_type]
    mamba = getattr(req_to_token_pool, "mamba_pool", None)
    if mamba is not None:
        tensors.extend([*mamba.mamba_cache.conv, mamba.mamba_cache.temporal])
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def offered(cache: PrefixCache, host: HostTier, tokens: TokenSeq, found: MatchResult) -> Offer:
    """The tokens past the device hit that loading would add to it (0 when nothing on the
    walk is on host or the tier prefers recomputing), and whether that load brings the
    state the hit resumes from."""
    offer_ = offer(cache, host, found.walk, _whole_pages(cache, tokens))
    if offer_ is None:
        return Offer(0, False)
    device, hit, _ = offer_
    path = found.walk.path
    state = any(n.end == hit and n.host_state is not None for n in path)
    windows = [s for s, g in enumerate(cache.tree.attention) if g.window is not None]
    window = sum(len(n.kv[s]) for n in path if n.host for s in windows) if hit > device else 0
    return Offer(hit - device, hit > device and state, window)


def load_hit(
    cache: PrefixCache,
    host: HostTier,
    tokens: TokenSeq,
    found: MatchResult,
    namespace: str | None,
) -> tuple[MatchResult, int]:
    """The match after the tier loaded what it decided to, and the tokens of it loaded."""
    prepared = host.prepare(cache, tokens, found.walk, _whole_pages(cache, tokens), namespace)
    if prepared is None:
        return found, 0
    _, matched, loaded = prepared
    return matched, loaded.host_hit


def _whole_pages(cache: PrefixCache, tokens: TokenSeq) -> int:
    """The tokens of `tokens` in whole pages: how far a hit, and so a load, may reach."""
    return len(tokens) - len(tokens) % cache.tree.page


def device_only(cache: PrefixCache, found: MatchResult) -> MatchResult:
    """`found` cut where its path reaches host memory: a match that loads nothing must not
    hand SGLang host pages (the tree's own match counts a host node's KV as held, which only a
    model without Mamba layers, whose hits need no checkpoint, reaches)."""
    path = found.walk.path
    first = next((i for i, n in enumerate(path) if n.host), None)
    if first is None:
        return found
    return cache.tree.match_walk(Walk(min(found.walk.length, path[first].start), path[:first]))


def host_counters(host: HostTier | None, hit_tokens: int, declined: int) -> dict[str, Any]:
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
        "host_loads_declined": declined,
        "host_stored_bytes": copies.stored_bytes,
        "host_loaded_bytes": copies.loaded_bytes,
        "host_kept_bytes": host.kept_bytes,
        "host_bytes": held,
    }
