"""The fragmentation study's view of the engine: two fragmentation metrics sampled every step.

The study runs the one stepped engine (bench/simulation/engine.py) on a JengaPool, with a cache that
never keeps a finished request (`NoCaching`), under `study_config`, which reproduces the engine the
study was first measured with:

1. admit waiting requests FIFO while the bytes in no held page (empty small pages of carved
   large pages included: `admission_rule="free-bytes"`) cover the candidate's prefill plus
   `decode_reserve` of its remaining decode tokens, plus what the running requests still need
   on the same terms (`reserve="fraction"`); an admitted request first takes its live SSM state
   (`state_at_admission`), and admission stops for the step when it cannot;
2. every running request in prefill grows by one chunk of up to `chunk_tokens` tokens
   (`chunk_budget="per-request"`: chunks of all prefilling requests interleave step by step);
   every request past its prefill decodes one token, in admission order, and leaves the moment
   it has decoded `decode_tokens` (`step_order="in-order"`). A token needs one KV page per
   attention group (one token per page: the only page size the engine allocates);
3. when an allocation fails, the newest running request is pushed out: it frees every page and
   is requeued; when re-admitted it prefills its prompt plus the tokens it has decoded so far
   (`preemption="reprefill"`).

`FragmentationObserver` watches it: admissions, failed allocations and, after every step, the
pool. Metrics (bytes; the caller divides by the capacity):

* unusable = padding inside held pages + the capacity remainder below one large page + empty
  small pages of a type that no live request will allocate again (KV types while any request is
  running or waiting; STATE types while any request waits, or runs without its state yet).
  Empty KV pages of a type in demand are usable: both allocators hand any open large page's
  empty pages to any owner before failing (request-aware step 4, naive first choice), so they
  are free capacity, merely out of order.
* reserved-but-empty = empty small pages inside carved large pages + token slots of the last
  partially filled KV page of each running request (Jenga's "unused small pages inside the large
  pages and the last page that is only partially filled"; none at one token per page) + padding
  inside held pages: an upper bound on unusable minus the remainder, as the stranded pages are
  some of the empty ones.
* at each failed allocation of type t: free-but-unusable bytes for t = remainder + empty small
  pages of the other types (free memory that exists but that t cannot take). A failure is
  "fragmentation-caused" when the free bytes inside large pages would have covered it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jenga_sglang.bench.simulation.cost_model import CostModel
from jenga_sglang.bench.simulation.engine import EngineConfig, EngineObserver, EngineSim
from jenga_sglang.bench.simulation.engine_batch import Running
from jenga_sglang.bench.simulation.engine_cache import EngineCache
from jenga_sglang.bench.traces.packed import PackedRequest
from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.eviction import LruEviction
from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.contracts import AdmissionPolicy, Branch, CheckpointPlan
from jenga_sglang.radix.pages import PageKind, PageType
from jenga_sglang.radix.tokens import TokenSeq


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


#: Engine rules the study runs under: its own (the module docstring, steps 1-3), or those of
#: the engine replays (`EngineConfig`'s defaults), so that its figures compare with theirs.
RULES = ("study", "replay")


def study_config(work: Workload, rules: str = "study") -> EngineConfig:
    """The engine's config for `work` under `rules` (one of RULES)."""
    if rules == "replay":
        return EngineConfig(chunk_tokens=work.chunk_tokens)
    if rules != "study":
        raise ValueError(f"unknown engine rules {rules!r}; known: {', '.join(RULES)}")
    return EngineConfig(
        chunk_tokens=work.chunk_tokens,
        max_running=len(work.prompts),
        chunk_budget="per-request",
        preemption="reprefill",
        reserve="fraction",
        decode_reserve_fraction=work.decode_reserve,
        step_order="in-order",
        state_at_admission=True,
        admission_rule="free-bytes",
    )


class NoCaching(AdmissionPolicy):
    """Keeps nothing: a finished request frees every page, so the pool holds only live ones."""

    def plan(self, branch: Branch, input_len: int, total_len: int, hit_len: int) -> CheckpointPlan:
        return CheckpointPlan()


class FragmentationObserver(EngineObserver):
    """Samples the pool's fragmentation after every engine step and at every failed
    allocation (the metrics of the module docstring)."""

    def __init__(self, pool: JengaPool) -> None:
        self.pool = pool
        geo = pool.geometry
        self.kv = [t for t in geo.page_types if t.kind is PageKind.KV]
        self.state = [t for t in geo.page_types if t.kind is PageKind.STATE]
        self.stride = {t.ptype: t.page_bytes for t in geo.types}
        self.per = {t.ptype: t.per_large for t in geo.types}
        self.stats = TimelineStats()

    def admitted(self, engine: EngineCache, run: Running) -> None:
        self.stats.admissions += 1

    def allocation_failed(
        self, engine: EngineCache, ptypes: tuple[PageType, ...], count: int
    ) -> None:
        # The engine allocates its attention groups together: the one that failed is the
        # first short of free pages (nothing is ever evictable here).
        short = [t for t in ptypes if self.pool.usage(t).free < count]
        self._record_failure(short[0] if short else ptypes[0], count)

    def stepped(self, engine: EngineCache, decode_batch: int, prefill_tokens: int) -> None:
        self.stats.steps += 1
        if decode_batch:
            self.stats.decode_steps += 1
            self.stats.decode_tokens += decode_batch
        # A state is still wanted by a waiting request or a running one that has none yet
        # (under the study's rules every running request took its state when admitted).
        self._sample(bool(engine.waiting) or any(not r.holds_state for r in engine.running))

    def _empty(self, t: PageType) -> int:
        """Empty small pages of `t` inside carved large pages."""
        return self.pool.usage(t).free - self.pool.free_large_pages * self.per[t]

    def _free_in_pages(self) -> int:
        """Bytes in no held page, excluding the remainder below one large page."""
        empties = sum(self._empty(t) * self.stride[t] for t in self.stride)
        return self.pool.free_large_pages * self.pool.geometry.large_page_bytes + empties

    def _sample(self, states_wanted: bool) -> None:
        pool, s = self.pool, self.stats
        in_demand = set(self.kv) | (set(self.state) if states_wanted else set())
        stranded = sum(self._empty(t) * self.stride[t] for t in self.stride if t not in in_demand)
        s.allocator_unusable.add(pool.padding_bytes() + stranded)
        s.unusable.add(pool.padding_bytes() + pool.remainder_bytes() + stranded)
        # one token per page: no running request has a partially filled last page
        s.reserved_empty.add(pool.fragmentation_bytes() + pool.padding_bytes())
        s.held.add(pool.held_bytes())

    def _record_failure(self, t: PageType, count: int) -> None:
        others = sum(self._empty(u) * self.stride[u] for u in self.stride if u != t)
        stats = self.stats.failures.setdefault(str(t), FailureStats())
        stats.count += 1
        stats.fragmentation_caused += self._free_in_pages() >= count * self.stride[t]
        stats.unusable.add(self.pool.remainder_bytes() + others)


class Timeline:
    """Runs `workload` on `pool` (fresh; the study's cache becomes its evictor, with nothing
    ever to evict) through the engine to completion."""

    def __init__(
        self, spec: ModelSpec, pool: JengaPool, workload: Workload, rules: str = "study"
    ) -> None:
        geo = pool.geometry
        if not any(t.kind is PageKind.KV for t in geo.page_types):
            raise ValueError("the timeline needs at least one attention (KV) page type")
        if geo.tokens_per_page != 1:
            raise ValueError(f"the engine holds one token per KV page, not {geo.tokens_per_page}")
        self.pool, self.work = pool, workload
        self.config = study_config(workload, rules)
        self.cache = PrefixCache(spec, pool, LruEviction(), NoCaching())
        self.observer = FragmentationObserver(pool)

    def requests(self) -> list[PackedRequest]:
        """The workload as engine requests, all at t = 0 (the tree stays empty: any ids do)."""
        out = TokenSeq(bytes(4 * self.work.decode_tokens))
        return [
            PackedRequest(i, 0, 0.0, TokenSeq(bytes(4 * n)), out)
            for i, n in enumerate(self.work.prompts)
        ]

    def run(self) -> TimelineStats:
        engine = EngineSim(
            self.requests(), self.cache, None, CostModel(), self.config, False, self.observer
        )
        st = engine.run()
        if st.rejected:
            raise RuntimeError(
                f"{st.rejected} request(s) cannot run alone in a {self.pool.capacity_bytes}-byte "
                "pool"
            )
        self.pool.check_integrity()
        if self.pool.held_bytes():
            raise RuntimeError(f"{self.pool.held_bytes()} bytes still held after every request")
        stats = self.observer.stats
        stats.preemptions, stats.finished = st.retractions, st.requests
        return stats
