"""Sliding-window groups in the tree: tombstones a later request revives, and the pages out of
every window that go before anything else when the window group is short (Jenga §5.2)."""

from __future__ import annotations

from radix_helpers import attention_spec, make_cache, memory, seq

from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.node import Node


def _insert(cache: PrefixCache, start: int, end: int, dropped: int) -> Node:
    """Insert [0, end) (the tree holds [0, start)) with the window group's first `dropped`
    new positions already gone, as a request whose out-of-window KV the engine freed."""
    full, swa = cache.tree.kv_types
    kv = [
        cache.memory.alloc(full, end - start, 0),
        cache.memory.alloc(swa, end - start - dropped, 0),
    ]
    return cache.tree.insert(seq(0, end), start, kv, {}, now=cache.tick())


def test_a_request_that_brings_the_window_revives_the_tombstones() -> None:
    cache = make_cache(attention_spec(window=2))
    _, swa = cache.tree.kv_types
    leaf = _insert(cache, 0, 10, dropped=6)
    assert leaf.tombstones == (0, 6)
    assert cache.tree.match(seq(0, 7)).length == 0  # 5 and 6 are gone
    held = memory(cache).held_bytes()
    revived = _insert(cache, 0, 10, dropped=3)  # recomputed, its own window from position 3
    assert revived is leaf
    assert leaf.tombstones == (0, 3)
    assert [len(p) for p in leaf.kv] == [10, 7]
    assert cache.tree.match(seq(0, 7)).length == 7
    assert cache.tree.match(seq(0, 4)).length == 0  # 2 is still gone (neither had it)
    # the duplicates freed: 10 full pages and the 4 window pages the tree already had
    assert memory(cache).held_bytes() == held + 3 * cache.memory.page_bytes(swa)
    cache.check_integrity()


def test_revived_pages_keep_the_tombstones_leading_in_every_node() -> None:
    cache = make_cache(attention_spec(window=2))
    _insert(cache, 0, 12, dropped=10)
    _insert(cache, 0, 4, dropped=0)  # splits [0, 4) | [4, 12): revives [0, 4)
    upper, lower = sorted(cache.tree.nodes(), key=lambda n: n.start)
    assert (upper.end, upper.tombstones, lower.tombstones) == (4, (0, 0), (0, 6))
    _insert(cache, 0, 12, dropped=7)  # brings [7, 12): lower's tombstones [4, 10) -> [4, 7)
    assert lower.tombstones == (0, 3)
    assert cache.tree.match(seq(0, 9)).length == 9
    assert cache.tree.match(seq(0, 8)).length == 4  # needs 6 (gone): falls back to 4
    cache.check_integrity()


def test_a_short_window_group_drops_out_of_window_pages_before_any_entry() -> None:
    cache = make_cache(attention_spec(window=2), budget=16 * 2 * 14)  # 14 tokens, both groups
    _, swa = cache.tree.kv_types
    old = _insert(cache, 0, 10, dropped=0)
    cache.tick()
    branch = cache.tree.insert(
        seq(0, 4).concat(seq(50, 4)), 4, cache.allocate_kv(4, 1), {}, now=cache.tick()
    )
    assert old.parent is not None and old.parent.end == 4
    upper = old.parent
    cache.memory.alloc(swa, 8, 2)  # short of window pages: out-of-window ones go, no entry
    assert (upper.tombstones, old.tombstones, branch.tombstones) == ((0, 2), (0, 4), (0, 2))
    assert cache.tree.evicted_nodes == 0
    # a hit at every node end is still valid
    assert cache.tree.match(seq(0, 4).concat(seq(50, 4))).length == 8
    assert cache.tree.match(seq(0, 10)).length == 10
    assert cache.tree.match(seq(0, 4)).length == 4
    assert cache.tree.match(seq(0, 7)).length == 4  # inside the edge no window: back to 4
    cache.memory.alloc(swa, 1, 2)  # nothing out of window left: an entry goes
    assert cache.tree.evicted_nodes == 1
    cache.check_integrity()


def test_a_locked_node_keeps_its_last_window() -> None:
    """A lock ends where its request's cached prefix does (PrefixCache.anchor), so the
    request reads no window page before the node's last window: a long prompt being
    prefilled keeps a window of its own path, not its whole length."""
    cache = make_cache(attention_spec(window=2), budget=16 * 2 * 12)
    leaf = _insert(cache, 0, 10, dropped=0)
    cache.tree.lock(leaf)
    _, swa = cache.tree.kv_types
    assert cache.tree.evict_for(swa)
    assert leaf.tombstones == (0, 8) and leaf.parent is not None
    assert memory(cache).usage(swa).used == 2  # the last window, still the request's
    assert not cache.tree.evict_for(swa)  # nothing else: the locked entry stays
    assert cache.tree.match(seq(0, 10)).length == 10
    cache.check_integrity()


def test_anchor_splits_a_hit_inside_an_edge() -> None:
    cache = make_cache(attention_spec())
    leaf = cache.tree.insert(seq(0, 10), 0, cache.allocate_kv(10, 0), {}, now=1)
    found = cache.lookup(seq(0, 6).concat(seq(50, 2)))
    assert found.length == 6 and found.node is leaf
    node = cache.anchor(found)
    assert node is not None and (node.start, node.end) == (0, 6)
    assert cache.anchor(cache.lookup(seq(0, 6))) is node  # ends there already: no split
    assert cache.anchor(cache.lookup(seq(50, 3))) is None
    cache.check_integrity()
