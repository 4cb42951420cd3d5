"""SGLang's prefill admission budget over the shared Jenga pool: KV the tree's states can free.

SGLang's `PrefillAdder` admits a request when its tokens fit in `available_size()` plus the
tree's `full_evictable_size()`: free KV slots and the KV of unlocked nodes. On the shared
Jenga pool (pool/shared.py) a state the tree keeps holds bytes KV could use too, and the
allocation that follows an admission reclaims them: SGLang asks our backend to evict, and our
policy drops states as readily as KV (slots/sglang_slots.py `SglangSlots.evict`). A check that
does not count them waits for room nothing will make once states fill the pool and no request
runs to free KV: a request that fits waits forever. Seen with the tiny NemotronH,
`--max-total-tokens 2048 --max-mamba-cache-size 12`, the ninth turn of an agent session: 147
tokens needed, 64 counted, 7 evictable states of 22 holding the rest.

`SharedPoolBudget` answers SGLang's admission questions first as SGLang would, and where that
answer is no while no running or admitted request reserves tokens (the budget's offset is 0),
again with the KV the tree's evictable states would free added
(`SharedJengaPool.kv_room_freeing`: exact for the pool's layout, a state frees KV only where
its large page empties). What it adds is what the eviction after admission can reach:
everything unlocked, as SGLang's own evictable count assumes.

Why only then. The count walks the tree's states (O(states + locked nodes): about 2 ms for
5,000 states on our 2-core CPU), and a saturated server would ask it of its waiting head on
every decode step; while requests run, the head waits for them as SGLang's admission makes
it, and the one wait that never ends, with nothing running, is the one it ends. The rule
depends on the tree and the pool alone, so tensor-parallel ranks, which hold equal trees,
decide alike.

With a host tier (`--jenga-host-gb`) the adder reserves a host hit's tokens, prepares the
load-back with this budget (`prepare_load_back`) and then calls the backend's
`init_load_back`. SGLang reserves no room for a checkpoint the load brings, which on the pool
may take a large page KV was counted on; the budget leaves itself on the backend
(`admission_budget`), which asks it `fits_loaded_state` and loads nothing where the state
does not fit (binding/host/tier.py).

Still short with nothing running, the request's own cached path is what pins the pool:
SGLang locks it while deciding, and our lock pins every state on it (the same session's
tenth turn: 148 tokens needed, 142 reachable, 17 of its path's states locked). The budget
then leaves the shortfall owed to the tree (`owe_kv`, binding/cache/memory_calls.py), which
evicts it at the next match, when nothing of that request is locked: the server's policy
drops the path's inner states first (tests/test_sglang_jenga_pool.py), and the request is
admitted within a few passes.

The slot counts the scheduler's idle leak check compares (`available + evictable + protected
== size`) are unchanged: this budget only reads them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sglang.srt.mem_cache.prefill_budget import PrefillBudget

from jenga_sglang.pool.shared import SharedJengaPool

T = TypeVar("T")
logger = logging.getLogger(__name__)
_last_stall_report = float("-inf")  # monotonic time of the last stall warning (one a minute)


class SharedPoolBudget(PrefillBudget):  # type: ignore[misc]  # sglang has no types
    """SGLang's `PrefillBudget` over a `JengaKVAllocator` and our backend, with the KV of the
    tree's evictable states counted where SGLang's count alone says no and nothing runs."""

    def __init__(
        self, allocator: Any, tree_cache: Any, *, num_mixed_decode_tokens: int = 0
    ) -> None:
        super().__init__(allocator, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens)
        self.shared: SharedJengaPool = allocator.shared
        self._state_kv = 0  # what state_tokens() adds while a question is asked again
        # Within one question (`_question`) the tree does not change: its evictable states are
        # walked, and what the reserve takes back is computed, once however often it is read.
        self._asking = False
        self._states: frozenset[int] | None = None
        self._closing: int | None = None
        self._load_back_tokens = 0  # SGLang's reservation for the load-back it prepares
        # PrefillAdder makes one budget per pass and prepares each load-back with it just
        # before it calls the backend's `init_load_back`, which reads it (`fits_loaded_state`).
        tree_cache.admission_budget = self

    def _question(self, ask: Callable[[], T]) -> T:
        """`ask()`, one of SGLang's questions, with the tree's states walked at most once."""
        if self._asking:
            return ask()
        self._asking = True
        try:
            return ask()
        finally:
            self._asking, self._states, self._closing = False, None, None

    def _evictable_states(self) -> frozenset[int]:
        states = self._states
        if states is None:
            states = self.tree_cache.evictable_state_ids()
            if self._asking:
                self._states = states
        return states

    def state_tokens(self) -> int:
        """KV tokens dropping every evictable state of the tree would free, pool as it is."""
        if not self.tree_cache.mamba_evictable_size():
            return 0
        shared = self.shared
        gained = shared.kv_room_freeing(self._evictable_states()) - shared.room(shared.kv_type)
        return max(0, gained) * int(self.page_size)

    def _kv_closing(self) -> int:
        """`SharedJengaPool.kv_closing` with the tree's evictable states freed; those are
        walked only while the reserve is short of free large pages."""
        closing = self._closing
        if closing is None:
            closing = self.shared.kv_closing()
            if closing and self.tree_cache.mamba_evictable_size():
                closing = self.shared.kv_closing(self._evictable_states())
            if self._asking:
                self._closing = closing
        return closing

    def _available_and_evictable(self) -> int:
        """Free KV tokens, what evicting the tree's evictable KV frees, and (retrying) what
        dropping its states does. SGLang counts evictable KV one to one; on the pool a KV free
        that returns a large page while the state reserve is short of free ones gives that
        page to the reserve (`SharedJengaPool.kv_closing`, counted with the tree's evictable
        states freed too, as evicting everything evictable frees them: `_kv_closing`), so
        that much is not counted. Without it an admission could take more than its
        allocation then got: SGLang's `alloc_for_extend` ran out of memory (bench/RESULTS.md,
        the host tier's sessions)."""
        evictable = int(self.tree_cache.full_evictable_size())
        closing = self._kv_closing() * int(self.page_size) if evictable else 0
        # What fits without evicting still fits: SGLang evicts only for what is not free.
        return int(super()._available_and_evictable()) - min(evictable, closing) + self._state_kv

    def _retry(self, decide: Callable[[], T], yes: Callable[[T], bool]) -> T:
        """`decide()` as SGLang counts; if that says no while nothing runs or was admitted
        (no offset), again with the states' KV counted (the question's one walk of the
        tree's states, however often it reads the remaining tokens)."""
        answer = decide()
        if yes(answer) or self.total_offset or not self.tree_cache.mamba_evictable_size():
            return answer
        self._state_kv = self.state_tokens()
        try:
            return decide()
        finally:
            self._state_kv = 0

    def prepare_load_back(self, *, full_tokens: int, **_: Any) -> bool:
        """SGLang's reservation for the load-back of a request it admits (the host tokens,
        its extend, its decode headroom), kept for `fits_loaded_state`; nothing to move."""
        self._load_back_tokens = int(full_tokens)
        return True

    def fits_loaded_state(self) -> bool:
        """Whether the prepared load-back still fits when it brings a checkpoint too. SGLang
        reserves the load's KV tokens but no state (its per-slot charge is for its own unified
        pool), and on the Jenga pool a state may take a large page KV was counted on
        (`SharedJengaPool.kv_cost_of_state`): without this the extend's allocation could
        find less than the admission counted."""
        cost = self.shared.kv_cost_of_state() * int(self.page_size)

        def ask() -> bool:
            return self._load_back_tokens + cost <= int(self.remaining_total)

        return self._question(ask)

    # ---- the questions SGLang's PrefillAdder asks (sglang/srt/mem_cache/prefill_budget.py)

    def has_capacity(self) -> bool:
        return self._question(
            lambda: self._retry(lambda: bool(super(SharedPoolBudget, self).has_capacity()), bool)
        )

    def check_prefill(self, **kwargs: Any) -> tuple[bool, int | None]:
        def decide() -> tuple[bool, int | None]:
            admit, limit = super(SharedPoolBudget, self).check_prefill(**kwargs)
            return bool(admit), limit

        def ask() -> tuple[bool, int | None]:
            answer = self._retry(decide, lambda answer: answer[0])
            if not answer[0] and not self.total_offset:
                self._stalled(int(kwargs.get("total_tokens", 0)))
            return answer

        return self._question(ask)

    def _stalled(self, tokens: int) -> None:
        """No running or admitted request reserves tokens (no offset), and the request does
        not fit even with every unlocked page counted: no finishing request will free any.
        What pins the pool then is locked: the request's own cached path, which SGLang
        locks while it decides, with the states on it. The tree owes the shortfall, and
        evicts it at the next match, the path unlocked (`owe_kv`, binding/cache/memory_calls.py).
        Logged at most once a minute, with the figures."""
        global _last_stall_report
        reach = int(self.remaining_total) + self.state_tokens()
        self.tree_cache.owe_kv(tokens - reach + 1)  # admitted when tokens < remaining
        now = time.monotonic()
        if now - _last_stall_report < 60.0:
            return
        _last_stall_report = now
        logger.warning(
            "--enable-jenga: a request of %d tokens waits: the Jenga pool can free %d KV "
            "tokens (evictable states included) and %d states are locked (its cached path "
            "is locked while it is admitted); evicting from the tree for it",
            tokens,
            reach,
            self.tree_cache.mamba_protected_size(),
        )

    def can_allocate_prefill(self, **kwargs: Any) -> bool:
        def decide() -> bool:
            return bool(super(SharedPoolBudget, self).can_allocate_prefill(**kwargs))

        return self._question(lambda: self._retry(decide, bool))

    def available_chunk_tokens(self, chunk_limit: int) -> int | None:
        """A continuing chunk as large as the limit allows: counted with the states' KV when
        SGLang's count alone would shorten it."""

        def decide() -> int | None:
            tokens = super(SharedPoolBudget, self).available_chunk_tokens(chunk_limit)
            return None if tokens is None else int(tokens)

        return self._question(
            lambda: self._retry(decide, lambda t: t is not None and t >= chunk_limit)
        )
