"""SharedJengaPool's state reserve: netted against the states requests hold, never short.

Geometry: KV pages of 256 bytes (3 per large page), state pages of 384 bytes (2 per large page).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.pool.shared import SharedJengaPool
from jenga_sglang.pool.sizing import compute_geometry
from jenga_sglang.radix.pages import PageKind, PageType

KV = PageType(PageKind.KV, 0)
STATE = PageType(PageKind.STATE, 1)
LARGE = 768


def _shared(large_pages: int, reserve: int) -> SharedJengaPool:
    pool = JengaPool(compute_geometry({KV: 256, STATE: 384}), large_pages * LARGE)
    return SharedJengaPool(pool, KV, STATE, reserve)


def test_reserve_shrinks_by_the_states_requests_hold() -> None:
    """10 large pages, reserve 4 states (2 large pages). Request-held states come out of the
    reserve; a state the tree adopts goes back into it."""
    shared = _shared(10, 4)
    tree: list[int] = []
    assert shared.room(KV) == 8 * 3 and shared.reserve_needed() == 4
    held = shared.alloc(STATE, 2)  # no tree attached: nothing is netted (the old reserve)
    assert held is not None and shared.held_by_requests() == 0
    assert shared.room(KV) == 7 * 3  # 1 large page of states + 2 of reserve closed to KV
    shared.attach_tree(lambda: len(tree))
    assert shared.held_by_requests() == 2 and shared.reserve_needed() == 2
    assert shared.room(KV) == 8 * 3  # the requests' page is the reserve's first page
    more = shared.alloc(STATE, 2)
    assert more is not None and shared.reserve_needed() == 0
    assert shared.room(KV) == 8 * 3  # 4 states held: the whole reserve is in use
    tree.extend(more)  # the tree adopts two of them: requests may demand them again
    assert shared.held_by_requests() == 2 and shared.room(KV) == 7 * 3
    got = shared.alloc(KV, shared.room(KV))
    assert got is not None and shared.room(KV) == 0
    assert shared.room(STATE) + shared.held_by_requests() >= shared.state_reserve
    shared.free(STATE, held)  # a request leaves: its page frees, KV still may not take it
    assert shared.room(KV) == 0 and shared.room(STATE) == 2 + 2 == shared.reserve_needed()
    shared.check_integrity()


def test_without_requests_the_reserve_is_whole() -> None:
    shared = _shared(10, 4)
    shared.attach_tree(lambda: shared.allocated(STATE))  # every state is the tree's
    assert shared.alloc(STATE, 3) is not None
    assert shared.held_by_requests() == 0 and shared.reserve_needed() == 4
    assert shared.room(KV) == (10 - 2 - 2) * 3  # 2 pages of tree states + 2 of reserve


RUNNING, TRACKING = 3, 1  # max running requests, tracking slots per request
PER_REQUEST = 1 + TRACKING

ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "finish_free", "finish_donate", "fork", "kv", "kv_free"]),
        st.integers(0, 40),
    ),
    max_size=60,
)


class Engine:
    """The scheduler's view: requests admitted by count, states taken at admission (after
    evicting tree states, as `ensure_mamba_capacity` does), KV growing into all it may."""

    def __init__(self, shared: SharedJengaPool) -> None:
        self.shared = shared
        self.requests: list[list[int]] = []
        self.tree: list[int] = []  # states the tree holds (unlocked: evictable)
        self.kv: list[int] = []
        shared.attach_tree(lambda: len(self.tree))

    def admit(self) -> None:
        if len(self.requests) >= RUNNING:
            return  # the scheduler's max-running check
        while self.shared.room(STATE) < PER_REQUEST and self.tree:
            self.shared.free(STATE, [self.tree.pop()])
        states = self.shared.alloc(STATE, PER_REQUEST)
        assert states is not None, "a request admitted by count found no state slots"
        self.requests.append(states)

    def step(self, op: str, n: int) -> None:
        shared = self.shared
        if op == "admit":
            self.admit()
        elif op in ("finish_free", "finish_donate") and self.requests:
            states = self.requests.pop(n % len(self.requests))
            if op == "finish_donate":
                self.tree.append(states.pop())  # its latest state enters the tree
            shared.free(STATE, states)
        elif op == "fork" and self.requests and shared.room(STATE) > 0:
            fork = shared.alloc(STATE, 1)  # a running checkpoint: a copy for the tree
            assert fork is not None
            self.tree.extend(fork)
        elif op == "kv":
            free_large = shared.pool.free_large_pages
            got = shared.alloc(KV, min(n, shared.room(KV)))
            self.kv.extend(got or [])
            if shared.pool.free_large_pages < free_large:  # KV carved: the reserve is whole
                assert shared.room(STATE) + shared.held_by_requests() >= shared.state_reserve
        elif op == "kv_free" and self.kv:
            cut = n % (len(self.kv) + 1)
            shared.free(KV, self.kv[:cut])
            del self.kv[:cut]


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(4, 9))
def test_admitted_requests_always_find_their_states(
    steps: list[tuple[str, int]], pages: int
) -> None:
    """Any interleaving of admissions, finishes (freed or donated to the tree), forks and KV
    growth: a request admitted while fewer than RUNNING run always gets 1 + TRACKING states,
    and room + held + tree >= reserve holds throughout (the invariant of pool/shared.py)."""
    shared = _shared(pages, RUNNING * PER_REQUEST)
    engine = Engine(shared)
    for op, n in steps:
        engine.step(op, n)
        held = shared.held_by_requests()
        assert held == sum(len(r) for r in engine.requests)
        assert shared.room(STATE) + held + len(engine.tree) >= shared.state_reserve
        shared.check_integrity()
    while len(engine.requests) < RUNNING:  # fill up to the limit at the end, whatever KV took
        engine.admit()


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(4, 9), st.data())
def test_kv_room_freeing_is_the_room_freeing_them_makes(
    steps: list[tuple[str, int]], pages: int, data: st.DataObject
) -> None:
    """`kv_room_freeing(ids)` moves nothing and equals `room(KV)` once those tree states are
    freed, whatever the layout: two states share a large page, so a state frees KV only where
    its large page empties, and the reserve may close what does."""
    shared = _shared(pages, RUNNING * PER_REQUEST)
    engine = Engine(shared)
    for op, n in steps:
        engine.step(op, n)
    gone = data.draw(st.lists(st.sampled_from(engine.tree), unique=True)) if engine.tree else []
    before = shared.pool.snapshot()
    predicted = shared.kv_room_freeing(gone)
    assert shared.pool.snapshot() == before
    for state in gone:
        engine.tree.remove(state)
    shared.free(STATE, gone)
    assert shared.room(KV) == predicted


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(4, 9))
def test_kv_cost_of_state_is_the_room_a_tree_state_takes(
    steps: list[tuple[str, int]], pages: int
) -> None:
    """`kv_cost_of_state()` moves nothing and is what `room(KV)` loses when one more state is
    allocated and the tree holds it (a checkpoint loaded back from host memory), whatever
    the layout: 0 while empty state pages spare the reserve, else what its page closes."""
    shared = _shared(pages, RUNNING * PER_REQUEST)
    engine = Engine(shared)
    for op, n in steps:
        engine.step(op, n)
    if not shared.room(STATE):
        return
    before, room = shared.pool.snapshot(), shared.room(KV)
    predicted = shared.kv_cost_of_state()
    assert shared.pool.snapshot() == before and predicted >= 0
    loaded = shared.alloc(STATE, 1)
    assert loaded is not None
    engine.tree.extend(loaded)
    assert room - shared.room(KV) == predicted


def test_a_state_that_must_evict_first_counts_a_whole_large_page_of_kv() -> None:
    """No empty state page and no free large page: the state's allocation evicts first,
    perhaps KV, and `kv_cost_of_state` counts the most one state can take."""
    shared = _shared(4, 0)
    assert shared.alloc(KV, shared.room(KV)) is not None
    assert shared.room(STATE) == 0 and shared.pool.free_large_pages == 0
    assert shared.kv_cost_of_state() == shared.pool.geometry.of(KV).per_large == LARGE // 256


def test_kv_room_freeing_refuses_a_state_not_allocated() -> None:
    shared = _shared(4, 2)
    held = shared.alloc(STATE, 1)
    assert held is not None
    try:
        shared.kv_room_freeing([held[0] + 1])  # its large page's other, empty, state page
    except ValueError as exc:
        assert "not held" in str(exc)
    else:
        raise AssertionError("an empty state page was counted as freeable")


@settings(max_examples=200, deadline=None)
@given(ops, st.integers(4, 9), st.data())
def test_freeing_kv_adds_at_least_the_freed_less_what_the_reserve_closes(
    steps: list[tuple[str, int]], pages: int, data: st.DataObject
) -> None:
    """Evicting F KV pages and some tree states changes `room(KV)` by at least F minus
    `kv_closing(those states)`, whichever go, in either order: an admission counting
    evictable KV one to one, as SGLang's does, overcounts by up to that while the reserve is
    short of free large pages. Room may even fall (found by this test): the last used page of
    a KV large page, freed, hands the whole page, its empty pages with it, to the reserve."""
    shared = _shared(pages, RUNNING * PER_REQUEST)
    engine = Engine(shared)
    for op, n in steps:
        engine.step(op, n)
    gone = data.draw(st.lists(st.sampled_from(engine.kv), unique=True)) if engine.kv else []
    states = data.draw(st.lists(st.sampled_from(engine.tree), unique=True)) if engine.tree else []
    room, closing = shared.room(KV), shared.kv_closing(states)
    assert closing <= shared.kv_closing()  # freeing states never closes more
    for state in states:  # the tree's states go first or after: the room ends the same
        engine.tree.remove(state)
    if data.draw(st.booleans()):
        shared.free(STATE, states)
        shared.free(KV, gone)
    else:
        shared.free(KV, gone)
        shared.free(STATE, states)
    assert shared.room(KV) >= room + len(gone) - closing


def test_a_short_reserve_takes_the_large_pages_freeing_kv_returns() -> None:
    """The case the bound is for: 6 large pages, reserve 4 states (2 large pages). KV fills
    every page the reserve leaves; then requests' states leave as tree states (still needed
    by the reserve) and take 2 of KV's large pages back when KV frees them."""
    shared = _shared(6, 4)
    tree: list[int] = []
    shared.attach_tree(lambda: len(tree))
    held = shared.alloc(STATE, 4)  # requests hold the whole reserve: KV may take the rest
    assert held is not None and shared.reserve_needed() == 0
    kv = shared.alloc(KV, shared.room(KV))
    assert kv is not None and len(kv) == 4 * 3 and shared.room(KV) == 0
    tree.extend(held)  # the requests finish into the tree: the reserve needs 4 states again
    closing = shared.kv_closing()
    assert shared.reserve_needed() == 4 and closing == 2 * 3
    shared.free(KV, kv)  # 12 pages freed, 6 of them on the 2 large pages the reserve takes
    assert shared.room(KV) == len(kv) - closing == 6 and shared.kv_closing() == 0


def test_freeing_a_kv_pages_last_used_page_may_lower_the_room() -> None:
    """Hypothesis's counterexample to a bound that never fell: 5 large pages, a reserve of 6
    states. One KV page in a carved large page leaves its 2 empty pages as room; freed, the
    large page returns whole and the short reserve takes it, empty pages and all."""
    shared = _shared(5, RUNNING * PER_REQUEST)
    engine = Engine(shared)
    for op in ("admit", "fork", "fork", "kv", "finish_donate"):
        engine.step(op, 1 if op == "kv" else 0)
    assert engine.kv and shared.room(KV) == 2 and shared.kv_closing() == 3
    shared.free(KV, engine.kv)
    assert shared.room(KV) == 0 == 2 + 1 - 3
