"""The live host tier (`--jenga-host-gb`) on a hybrid-SWA model (gpt-oss's layout), through
SGLang's calls on its real CPU pools (tests/swa_session.py): a session pushed out of the device
by other requests moves to host memory, full KV and window KV, and its next turn is admitted
with both loaded back into fresh slots.

What a window layer reads goes through SGLang's full-to-window slot mapping, so a load-back
must also point the fresh full slots at the fresh window slots loaded with them.
`SwaSession.check_window` reads every position a window layer of the request reads, through that
mapping, and compares with the value the emulated forward wrote for exactly that prefix;
`check_pools` checks every slot of both pools has one owner and the tree's mapping invariant.
"""

from __future__ import annotations

import pytest
from swa_session import SwaSession

from jenga_sglang.radix.tokens import TokenSeq
from tests.admission import flush_cache

pytestmark = pytest.mark.sglang


def toks(base: int, n: int) -> list[int]:
    return [base + (7 * i) % 97 for i in range(n)]


def pushed_to_host(page: int, jenga: bool) -> tuple[SwaSession, list[int], list[int]]:
    """A session served, then pushed out of the device by others (SGLang's pools, or the Jenga
    pool with `jenga`): the session, its prompt and its reply."""
    s = SwaSession(
        page=page, full=192, swa=96, chunk=32, jenga_bytes=8 * 2 * 160 if jenga else None,
        host_gb=1.0,
    )  # fmt: skip
    prompt, reply = toks(100, 60), toks(300, 4)
    s.serve(prompt, reply)
    for k in range(4):  # other sessions: the device cannot hold them and the first
        s.serve(toks(1000 * (k + 1), 60), toks(2000 + k, 4))
    return s, prompt, reply


@pytest.mark.parametrize(("page", "jenga"), [(1, False), (4, False), (1, True), (4, True)])
def test_a_demoted_session_comes_back_with_its_window(page: int, jenga: bool) -> None:
    s, prompt, reply = pushed_to_host(page, jenga)
    host = s.cache.host
    assert host is not None and host.demoted_nodes > 0
    history = [*prompt, *reply[:-1]]
    walk = s.cache.cache.tree.walk(TokenSeq.of(history))
    assert any(n.host for n in walk.path)  # the first session's path reaches host memory
    turn2 = [*history, *toks(500, 10)]
    before = s.cache.host_hit_tokens
    req = s.admit(turn2, 3)  # check_window: full and window KV of the hit, as written
    hit = int(req.prefix_len)
    assert hit >= len(history) - len(history) % page - page
    assert s.cache.host_hit_tokens > before  # it came from host memory
    assert req.swa_host_hit_length > 0  # and SGLang's SWA budget was told of its window
    s.prefill(req, 7)
    s.decode_and_finish(req, turn2, [7, 8, 9])
    s.check_pools()
    assert s.cache.snapshot().host_loaded_bytes > 0


@pytest.mark.parametrize("page", [1, 4])
def test_a_routers_view_follows_the_window_to_host_and_back(page: int) -> None:
    """With KV events on, a demoted session's spans stay published (a load-back serves
    them) and the load moves them to the fresh slots: after every step the router's blocks
    are exactly the paths to node ends whose window the tree holds, on the device or in host
    memory (tests/test_kv_events.py), and its prediction is the worker's hit."""
    from jenga_sglang.bench.drivers.kv_index import BlockIndex
    from jenga_sglang.binding.slots.kv_events import attach
    from tests.test_kv_events import _window_usable_paths

    s = SwaSession(page=page, full=192, swa=96, chunk=32, host_gb=1.0)
    assert attach(s.cache, True) is not None
    router = BlockIndex(strict=True)

    def synced() -> None:
        router.apply(s.cache.take_events())
        assert router.paths() == _window_usable_paths(s.cache)
        s.cache.kv_events.check_integrity()

    prompt, reply = toks(100, 60), toks(300, 4)
    s.serve(prompt, reply)
    synced()
    for k in range(4):
        s.serve(toks(1000 * (k + 1), 60), toks(2000 + k, 4))
        synced()
    turn2 = [*prompt, *reply[:-1], *toks(500, 10)]
    predicted = router.predicted_hit(turn2)
    assert predicted > 0  # on host, still a hit: the router keeps it
    before = s.cache.host_hit_tokens
    req = s.admit(turn2, 3)
    assert s.cache.host_hit_tokens > before
    assert int(req.prefix_len) == predicted
    synced()
    assert router.predicted_hit(turn2) == predicted
    s.prefill(req, 7)
    s.decode_and_finish(req, turn2, [7, 8, 9])
    synced()
    s.check_pools()


@pytest.mark.parametrize("jenga", [False, True])
def test_flush_cache_empties_both_pools_and_serving_goes_on(jenga: bool) -> None:
    """SGLang's `flush_cache`: the cache's reset, then its pools cleared; every slot of both
    pools is free, no full slot names a window slot, and the next turn is cold."""
    s, prompt, reply = pushed_to_host(1, jenga)
    host = s.cache.host
    assert host is not None and host.host_nodes()
    flush_cache(s.cache, s.pool, s.alloc)
    assert next(s.cache.cache.nodes(), None) is None and not host.host_nodes()
    s.check_pools()
    assert int((s.alloc.full_to_swa_index_mapping[:-1] != 0).sum()) == 0
    turn2 = [*prompt, *reply[:-1], *toks(500, 10)]
    assert s.serve(turn2, [7, 8, 9]) == 0
    assert s.serve(turn2, [7, 8, 9]) > 0
