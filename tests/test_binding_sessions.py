"""`--enable-session-radix-cache` with our tree (binding/cache/sessions.py), through SGLang's own
scheduler calls on its real CPU pools (tests/mamba_session.py).

An open session keeps the path its finished requests inserted locked until it closes: the next
turn finds the history and the state at its end even when the pool needs room and nothing else
holds that path; a turn that extends the session's path moves the lock down, a branch adds one;
an aborted request, a request of an earlier incarnation of the id and a finish after the close
lock nothing; the close releases everything and the idle accounting balances again.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.admission import flush_cache
from tests.mamba_session import Session, load_sg, tokens

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def sg() -> Any:
    return load_sg()


def _serve(s: Session, inp: list[int], out: list[int], session: str | None, gen: int | None) -> int:
    """Serve one request of `session` (stamped with generation `gen`); its hit."""
    req = s.admit(inp, len(out), session_id=session)
    req.session_generation = gen  # what the scheduler stamps on a session's request
    hit = int(req.prefix_len)
    s.prefill(req, out[0])
    s.decode_and_finish(req, inp, out)
    return hit


def _locked(s: Session) -> list[int]:
    """Ends of the nodes something holds a lock on (lock_ref counts ancestors too)."""
    return sorted(n.end for n in s.cache.cache.tree.nodes() if n.lock_ref > 0)


def test_an_open_session_keeps_its_path_until_it_closes(sg: Any) -> None:
    s = Session(sg, radix_sessions=True)
    gen = s.cache.open_radix_session("chat")
    a, out1 = tokens(0, 60), tokens(3, 4)
    _serve(s, a, out1, "chat", gen)
    end1 = len(a) + len(out1) - 1
    assert s.cache.sessions.locks() == 1 and end1 in _locked(s)
    s.cache.evict(_evict_everything(s))  # the pool wants everything it can get
    assert s.cached_length(a + out1) == end1  # the session's path survived
    assert s.state_positions(a + out1) == [end1]

    b = tokens(5, 20, base=60)
    assert _serve(s, a + out1 + b, [7, 8], "chat", gen) == end1  # resumed from the kept state
    assert s.cache.sessions.locks() == 1  # the lock moved down the extended path
    end2 = len(a + out1 + b) + 1
    assert max(_locked(s)) == end2

    branch = a + out1 + tokens(2, 15, base=90)
    _serve(s, branch, [4, 5], "chat", gen)
    assert s.cache.sessions.locks() == 2  # a branch off the session's path adds a leaf

    assert s.cache.release_radix_session("chat") == 2
    assert _locked(s) == [] and s.cache.sessions.locks() == 0
    s.slots_balance()
    _serve(s, tokens(1, 30, base=120), [1, 2], "chat", gen)  # finishes after the close
    assert s.cache.sessions.locks() == 0
    s.slots_balance()


def test_stale_aborted_and_sessionless_requests_lock_nothing(sg: Any) -> None:
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    s = Session(sg, radix_sessions=True)
    old = s.cache.open_radix_session("s")
    new = s.cache.open_radix_session("s")  # the id reused: a new incarnation
    assert new != old and s.cache.ensure_session_generation("s") == new
    _serve(s, tokens(0, 40), [1, 2], "s", old)
    _serve(s, tokens(1, 40, base=50), [1, 2], None, None)
    assert s.cache.sessions.locks() == 0
    req = s.admit(tokens(2, 40, base=100), 2, session_id="s")
    req.session_generation = new
    s.prefill(req, 1)
    req.finished_reason = FINISH_ABORT("client went away")
    sg.release_kv_cache(req, s.cache, checkpoint=True)
    assert s.cache.sessions.locks() == 0 and _locked(s) == []
    s.slots_balance()


def test_without_the_flag_sessions_are_plain_requests(sg: Any) -> None:
    s = Session(sg)
    assert s.cache.open_radix_session("x") is None and s.cache.release_radix_session("x") == 0
    _serve(s, tokens(0, 40), [1, 2], "x", 1)
    assert _locked(s) == []


def _evict_everything(s: Session) -> Any:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    return EvictParams(num_tokens=10**6, mamba_num=10**3)


def test_flush_cache_closes_open_sessions_and_empties_the_tree(sg: Any) -> None:
    """SGLang's `/flush_cache` on an idle scheduler with sessions still open: their locks go
    with the tree, and a later turn of the session starts cold."""
    s = Session(sg, radix_sessions=True)
    gens = {name: s.cache.open_radix_session(name) for name in ("b-chat", "a-chat")}
    for k, (name, gen) in enumerate(gens.items()):
        _serve(s, tokens(k, 60, base=40 * k), tokens(3, 4), name, gen)
    assert s.cache.sessions.locks() == 2
    flush_cache(s.cache, s.pool, s.alloc)
    assert s.cache.sessions.locks() == 0 and next(s.cache.cache.nodes(), None) is None
    assert _serve(s, tokens(0, 60) + tokens(3, 4) + tokens(9, 5), [1, 2], "b-chat", None) == 0
