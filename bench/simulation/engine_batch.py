"""The engine's batch bookkeeping: a running request, its reserve, the admission test and the
per-step memory sample. Pure functions of the engine's state, kept apart from its loop
(bench/simulation/engine.py) so the loop reads as schedule, run, post-process."""

from __future__ import annotations

from collections import Counter

from jenga_sglang.bench.simulation.engine_config import EngineConfig, EngineStats
from jenga_sglang.bench.traces.packed import PackedRequest
from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.radix.lease import Lease
from jenga_sglang.radix.memory import CacheMemory
from jenga_sglang.radix.pages import PageKind, PageType


class Running:
    """A request in the batch and the pages it holds (tokens [hit, done) of its prefill, then
    one per token decoded since it was admitted).

    `target` is where its prefill ends: its input, plus (re-prefilled after a preemption) the
    output tokens it had decoded before, which `decoded` still counts."""

    def __init__(self, index: int, req: PackedRequest, hit: int, decoded: int = 0) -> None:
        self.index, self.req, self.hit = index, req, hit
        self.lease: Lease | None = None  # its hold on the cache, from admission to the end
        self.target = len(req.inp) + decoded
        self.done = hit  # prefill tokens whose KV exists (cached or prefilled)
        self.decoded = decoded  # output tokens produced

    @property
    def held(self) -> Lease:
        assert self.lease is not None, "a running request holds a lease"
        return self.lease

    @property
    def holds_state(self) -> bool:
        return self.lease is not None and self.lease.holds_state

    @property
    def prefilling(self) -> bool:
        return self.done < self.target

    @property
    def finished(self) -> bool:
        return not self.prefilling and self.decoded >= len(self.req.out)


def demand(
    kv_types: tuple[PageType, ...], state_type: PageType | None, kv_tokens: int, states: int
) -> Counter[PageType]:
    """Pages for `kv_tokens` tokens in every attention group plus `states` SSM states."""
    pages: Counter[PageType] = Counter(dict.fromkeys(kv_types, kv_tokens))
    if state_type is not None:
        pages[state_type] = states
    return pages


def reserve_tokens(run: Running, config: EngineConfig, retracted: bool) -> int:
    """KV tokens `run` may still need: the rest of its prefill plus its decode reserve.

    With a token reserve, a request that was pushed out before (`retracted`) reserves its whole
    output: otherwise it is re-admitted at once and pushed out again while the requests that
    pushed it out keep growing."""
    out = len(run.req.out)
    tokens = run.target - run.done
    if config.reserve == "fraction":
        return tokens + int(config.decode_reserve_fraction * (out - run.decoded) + 0.5)
    cap = out if retracted else config.decode_reserve_tokens
    return tokens + max(0, min(out, cap) - run.decoded)


def admits(memory: CacheMemory, pages: Counter[PageType], rule: str) -> bool:
    """Whether `pages` more pages can be admitted under `rule` (see EngineConfig)."""
    if rule == "fits":
        return memory.fits(pages)
    assert isinstance(memory, JengaPool), "the free-bytes rule needs a Jenga pool"
    need = sum(count * memory.page_stride(t) for t, count in pages.items())
    free = memory.free_large_pages * memory.geometry.large_page_bytes
    return need <= free + memory.fragmentation_bytes()


def record_step(
    stats: EngineStats, memory: CacheMemory, now: float, decode_batch: int, prefill: int
) -> None:
    """Append one step's row: the batch and the memory as used / evictable / wasted / free
    bytes, and the bytes held by KV pages and by SSM state pages."""
    used = evictable = 0
    held = [0, 0]  # KV, SSM state
    for ptype in memory.page_types:
        u = memory.usage(ptype)
        used += u.used * u.page_bytes
        evictable += u.evictable * u.page_bytes
        held[ptype.kind is PageKind.STATE] += (u.used + u.evictable) * u.page_bytes
    wasted = memory.wasted_bytes()
    free = memory.capacity_bytes - used - evictable - wasted
    stats.steps += 1
    stats.timeline.append((now, decode_batch, prefill, used, evictable, wasted, free))
    stats.held_by_kind.append((held[0], held[1]))
