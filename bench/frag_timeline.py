"""An engine-like timeline over a JengaPool, sampling two fragmentation metrics every step.

The engine (one step per loop iteration):

1. admit waiting requests FIFO (by arrival id) while the pool's free bytes cover the candidate's
   re-prefill plus `decode_reserve` of its remaining decode tokens, plus what the running requests
   still need on the same terms; an admitted request first allocates one page per STATE type (its
   live SSM state). A failed state allocation stops admission for this step;
2. every running request in prefill grows by one chunk of up to `chunk_tokens` tokens (chunks of
   all prefilling requests interleave step by step); every request past its prefill decodes one
   token (lock step). A token needs one KV page per attention group every `tokens_per_page` tokens;
3. when an allocation fails, the newest running request is preempted: it frees every page and is
   requeued; when re-admitted it prefills its prompt plus the tokens it has decoded so far;
4. a request that decoded `decode_tokens` tokens finishes and frees everything.

Metrics (bytes; the caller divides by the capacity):

* unusable = padding inside held pages + the capacity remainder below one large page + empty
  small pages of a type that no live request will allocate again (KV types while any request is
  running or waiting; STATE types while any request waits). Empty KV pages of a type in demand are
  usable: both allocators hand any open large page's empty pages to any owner before failing
  (request-aware step 4, naive first choice), so they are free capacity, merely out of order.
* reserved-but-empty = empty small pages inside carved large pages + token slots of the last
  partially filled KV page of each running request (Jenga's "unused small pages inside the large
  pages and the last page that is only partially filled") + padding inside held pages: an upper
  bound on unusable minus the remainder, as the stranded pages are some of the empty ones.
* at each failed allocation of type t: free-but-unusable bytes for t = remainder + empty small
  pages of the other types (free memory that exists but that t cannot take). A failure is
  "fragmentation-caused" when the free bytes inside large pages would have covered it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.radix.pages import IdPages, OutOfMemory, PageKind, PageType


@dataclass(frozen=True)
class Workload:
    """Requests arrive together at step 0; `prompts[i]` is request i's prompt in tokens."""

    prompts: tuple[int, ...]
    decode_tokens: int
    chunk_tokens: int
    decode_reserve: float  # share of the remaining decode tokens reserved at admission

    def __post_init__(self) -> None:
        if not self.prompts or min(self.prompts) <= 0:
            raise ValueError(f"prompts must be positive token counts, got {self.prompts[:5]}...")
        if self.decode_tokens <= 0 or self.chunk_tokens <= 0:
            raise ValueError(
                f"decode_tokens ({self.decode_tokens}) and chunk_tokens ({self.chunk_tokens}) "
                "must be positive"
            )
        if not 0.0 <= self.decode_reserve <= 1.0:
            raise ValueError(f"decode_reserve must be in [0, 1], got {self.decode_reserve}")


@dataclass
class Request:
    rid: int
    prompt: int
    decoded: int = 0
    filled: int = 0  # tokens whose KV pages are allocated in this admission
    target: int = 0  # tokens to prefill in this admission: prompt + decoded when admitted
    running: bool = False
    pages: dict[PageType, list[int]] = field(default_factory=dict)


@dataclass
class Series:
    """Time average (one sample per step) and maximum of one quantity."""

    total: int = 0
    samples: int = 0
    peak: int = 0

    def add(self, value: int) -> None:
        self.total += value
        self.samples += 1
        self.peak = max(self.peak, value)

    @property
    def mean(self) -> float:
        return self.total / self.samples if self.samples else 0.0


@dataclass
class FailureStats:
    """Failed allocations of one page type and the free-but-unusable bytes at each."""

    count: int = 0
    fragmentation_caused: int = 0
    unusable: Series = field(default_factory=Series)


@dataclass
class TimelineStats:
    steps: int = 0
    admissions: int = 0
    preemptions: int = 0
    finished: int = 0
    decode_steps: int = 0
    decode_tokens: int = 0
    held: Series = field(default_factory=Series)
    unusable: Series = field(default_factory=Series)
    allocator_unusable: Series = field(default_factory=Series)  # unusable minus the remainder
    reserved_empty: Series = field(default_factory=Series)
    failures: dict[str, FailureStats] = field(default_factory=dict)


class Timeline:
    """Runs `workload` on `pool` (which must be fresh and have no evictor) to completion."""

    def __init__(self, pool: JengaPool, workload: Workload) -> None:
        self.pool, self.work = pool, workload
        geo = pool.geometry
        self.kv = [t for t in geo.page_types if t.kind is PageKind.KV]
        self.state = [t for t in geo.page_types if t.kind is PageKind.STATE]
        if not self.kv:
            raise ValueError("the timeline needs at least one attention (KV) page type")
        self.tpp = geo.tokens_per_page
        self.stride = {t.ptype: t.page_bytes for t in geo.types}
        self.per = {t.ptype: t.per_large for t in geo.types}
        self.kv_stride = sum(self.stride[t] for t in self.kv)
        self.state_bytes = sum(self.stride[t] for t in self.state)
        self.waiting = [Request(i, n) for i, n in enumerate(workload.prompts)]
        self.running: list[Request] = []  # admission order: the last is the newest
        self.stats = TimelineStats()

    def run(self) -> TimelineStats:
        while self.waiting or self.running:
            self._admit()
            if not self.running:
                r = self.waiting[0]
                raise RuntimeError(
                    f"request {r.rid} ({r.prompt + r.decoded} tokens to prefill) cannot be "
                    f"admitted into an idle {self.pool.capacity_bytes}-byte pool"
                )
            self._step()
            self._sample()
        self.pool.check_integrity()
        if self.pool.held_bytes():
            raise RuntimeError(f"{self.pool.held_bytes()} bytes still held after every request")
        return self.stats

    # ---- admission -------------------------------------------------------------------------

    def _admit(self) -> None:
        while self.waiting:
            r = self.waiting[0]
            need = self.state_bytes + sum(self._outstanding(x) for x in [*self.running, r])
            if need > self._free_in_pages() or not self._alloc_states(r):
                return
            self.waiting.pop(0)
            r.target, r.filled, r.running = r.prompt + r.decoded, 0, True
            self.running.append(r)
            self.stats.admissions += 1

    def _outstanding(self, r: Request) -> int:
        """KV bytes `r` still needs: its prefill plus the reserved share of its decode."""
        left = self.work.decode_tokens - r.decoded
        tokens = r.prompt + r.decoded + int(self.work.decode_reserve * left + 0.5)
        have = len(r.pages[self.kv[0]]) if r.running else 0
        return max(0, self._pages_for(tokens) - have) * self.kv_stride

    def _alloc_states(self, r: Request) -> bool:
        r.pages = {t: [] for t in self.kv}
        for t in self.state:
            try:
                r.pages[t] = self.pool.alloc(t, 1, r.rid).ids()
            except OutOfMemory:
                self._record_failure(t, 1)
                self._free_all(r)
                return False
        return True

    # ---- one engine step -------------------------------------------------------------------

    def _step(self) -> None:
        self.stats.steps += 1
        batch = 0
        for r in list(self.running):
            if not r.running:  # preempted earlier in this step
                continue
            if r.filled < r.target:
                self._grow(r, min(self.work.chunk_tokens, r.target - r.filled))
            elif self._grow(r, 1):
                r.decoded += 1
                batch += 1
                if r.decoded >= self.work.decode_tokens:
                    self._finish(r)
        if batch:
            self.stats.decode_steps += 1
            self.stats.decode_tokens += batch

    def _grow(self, r: Request, tokens: int) -> bool:
        """Allocate KV pages for `tokens` more tokens; False when `r` itself was preempted."""
        want = self._pages_for(r.filled + tokens)
        for t in self.kv:
            while len(r.pages[t]) < want:
                count = want - len(r.pages[t])
                try:
                    r.pages[t] += self.pool.alloc(t, count, r.rid).ids()
                except OutOfMemory:
                    self._record_failure(t, count)
                    if self._preempt_newest() is r:
                        return False
        r.filled += tokens
        return True

    def _preempt_newest(self) -> Request:
        victim = self.running.pop()
        self._free_all(victim)
        victim.running, victim.filled = False, 0
        bisect.insort(self.waiting, victim, key=lambda x: x.rid)
        self.stats.preemptions += 1
        return victim

    def _finish(self, r: Request) -> None:
        self.running.remove(r)
        self._free_all(r)
        r.running = False
        self.stats.finished += 1

    def _free_all(self, r: Request) -> None:
        for t, ids in r.pages.items():
            if ids:
                self.pool.free(t, IdPages(ids))
        r.pages = {}

    # ---- metrics ---------------------------------------------------------------------------

    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.tpp)

    def _empty(self, t: PageType) -> int:
        """Empty small pages of `t` inside carved large pages."""
        return self.pool.usage(t).free - self.pool.free_large_pages * self.per[t]

    def _free_in_pages(self) -> int:
        """Bytes in no held page, excluding the remainder below one large page."""
        empties = sum(self._empty(t) * self.stride[t] for t in self.stride)
        return self.pool.free_large_pages * self.pool.geometry.large_page_bytes + empties

    def _sample(self) -> None:
        pool, s = self.pool, self.stats
        in_demand = set(self.kv) | (set(self.state) if self.waiting else set())
        stranded = sum(self._empty(t) * self.stride[t] for t in self.stride if t not in in_demand)
        s.allocator_unusable.add(pool.padding_bytes() + stranded)
        s.unusable.add(pool.padding_bytes() + pool.remainder_bytes() + stranded)
        partial = sum(len(r.pages[self.kv[0]]) * self.tpp - r.filled for r in self.running)
        empty = pool.fragmentation_bytes() + partial * self.kv_stride // self.tpp
        s.reserved_empty.add(empty + pool.padding_bytes())
        s.held.add(pool.held_bytes())

    def _record_failure(self, t: PageType, count: int) -> None:
        others = sum(self._empty(u) * self.stride[u] for u in self.stride if u != t)
        stats = self.stats.failures.setdefault(str(t), FailureStats())
        stats.count += 1
        stats.fragmentation_caused += self._free_in_pages() >= count * self.stride[t]
        stats.unusable.add(self.pool.remainder_bytes() + others)
