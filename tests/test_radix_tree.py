"""Table-driven tests of the heterogeneous radix tree: match rules, insert/split, locks, errors."""

from __future__ import annotations

import pytest
from radix_helpers import (
    attention,
    attention_spec,
    hybrid_spec,
    make_cache,
    mamba,
    memory,
    seq,
    toks,
)

from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.eviction import FlopAwareEviction
from jenga_sglang.radix.memory import ByteBudget, CacheMemory
from jenga_sglang.radix.pages import OutOfMemory, PageKind
from jenga_sglang.radix.tokens import TokenSeq


def insert_all(cache, key: TokenSeq, states=()):  # type: ignore[no-untyped-def]
    """Allocate pages for the part of `key` the tree lacks and insert it with `states`."""
    walk = cache.tree.walk(key)
    kv = cache.allocate_kv(len(key) - walk.length, owner=0)
    st = cache.allocate_states(len(states), owner=0)
    return cache.tree.insert(key, walk.length, kv, dict(zip(states, st, strict=True)), now=1)


@pytest.mark.parametrize(
    ("inserted", "query", "expected"),
    [
        ([], seq(0, 5), 0),
        ([seq(0, 8)], seq(0, 8), 8),
        ([seq(0, 8)], seq(0, 5), 5),  # attention-only: any prefix length is a hit
        ([seq(0, 8)], seq(0, 5).concat(toks(99)), 5),
        ([seq(0, 8)], toks(7, 1, 2), 0),
        ([seq(0, 8), seq(0, 4).concat(toks(50, 51))], seq(0, 4).concat(toks(50, 9)), 5),
    ],
)
def test_attention_only_match_lengths(inserted, query, expected):  # type: ignore[no-untyped-def]
    cache = make_cache(attention_spec())
    for key in inserted:
        insert_all(cache, key)
    assert cache.tree.match(query).length == expected
    cache.check_integrity()


@pytest.mark.parametrize(
    ("states", "query_len", "expected"),
    [
        ((), 10, 0),  # no checkpoint: a Mamba layer cannot resume anywhere
        ((10,), 10, 10),
        ((10,), 9, 0),  # the state at 10 is useless for a 9-token prefix
        ((4, 10), 9, 4),
        ((4, 10), 12, 10),
    ],
)
def test_mamba_hits_only_at_checkpoints(states, query_len, expected):  # type: ignore[no-untyped-def]
    cache = make_cache(hybrid_spec())
    insert_all(cache, seq(0, 10), states)
    query = seq(0, min(query_len, 10)).concat(seq(100, max(0, query_len - 10)))
    result = cache.tree.match(query)
    assert result.length == expected
    if expected:
        assert result.state is not None and result.node is not None
        assert result.node.end == expected
    cache.check_integrity()


def test_split_keeps_checkpoint_with_the_node_whose_end_it_represents():
    # SGLang issue #22935: splitting [0,10)+state@10 at 4 must leave the state at 10, not at 4.
    cache = make_cache(hybrid_spec())
    leaf = insert_all(cache, seq(0, 10), (10,))
    insert_all(cache, seq(0, 4).concat(toks(77, 78)), (6,))
    upper = leaf.parent
    assert upper is not None and upper.end == 4 and upper.state is None
    assert leaf.end == 10 and leaf.state is not None
    assert cache.tree.match(seq(0, 10)).length == 10
    assert cache.tree.match(seq(0, 4).concat(toks(1))).length == 0
    cache.check_integrity()


def test_insert_frees_pages_the_tree_already_holds():
    cache = make_cache(attention_spec())
    insert_all(cache, seq(0, 6))
    held = memory(cache).held_bytes()
    kv = cache.allocate_kv(6, owner=1)  # a request computed all 6 tokens again
    cache.tree.insert(seq(0, 6), 0, kv, {}, now=2)
    assert memory(cache).held_bytes() == held
    cache.check_integrity()


def test_sliding_window_tombstones_limit_valid_prefixes():
    # window 2: a prefix p is valid when tokens p-2 and p-1 still have pages.
    cache = make_cache(attention_spec(window=2))
    full, swa = cache.tree.kv_types
    key = seq(0, 10)
    kv_full = cache.memory.alloc(full, 10, 0)
    kv_swa = cache.memory.alloc(swa, 4, 0)  # the request dropped the first 6 window pages
    leaf = cache.tree.insert(key, 0, [kv_full, kv_swa], {}, now=1)
    assert leaf.tombstones == (0, 6)
    assert cache.tree.match(key).length == 10
    assert cache.tree.match(seq(0, 8)).length == 8  # needs 6, 7
    assert cache.tree.match(seq(0, 7)).length == 0  # needs 5 (dropped): nothing valid above 0
    cache.check_integrity()


def test_lock_protects_path_and_unlock_of_unlocked_node_fails():
    cache = make_cache(attention_spec(), budget=16 * 12)  # room for 12 tokens
    leaf = insert_all(cache, seq(0, 8))
    cache.tree.lock(leaf)
    assert memory(cache).usage(cache.tree.kv_types[0]).used == 8
    with pytest.raises(OutOfMemory):
        cache.allocate_kv(8, owner=1)  # only 4 free, the 8 cached ones are locked
    cache.tree.unlock(leaf)
    with pytest.raises(ValueError, match="not locked"):
        cache.tree.unlock(leaf)
    assert leaf.lock_ref == 0
    cache.allocate_kv(8, owner=1)  # now the leaf can go
    assert leaf.parent is None
    cache.check_integrity()


@pytest.mark.parametrize(
    "bad",
    [
        lambda c: c.tree.insert(TokenSeq.of([]), 0, c.allocate_kv(0, 0), {}, 1),
        lambda c: TokenSeq.of([1, 2.5, 3]),
        lambda c: TokenSeq.of([1, -2]),
        lambda c: c.tree.insert(seq(0, 3), 0, c.allocate_kv(2, 0), {}, 1),
        lambda c: c.tree.insert(seq(0, 3), 5, c.allocate_kv(0, 0), {}, 1),
        lambda c: c.tree.unlock(c.tree.match(seq(0, 4)).node),
    ],
    ids=["empty-key", "float-token", "negative-token", "page-count", "start", "unlock"],
)
def test_bad_input_raises_and_leaves_everything_as_it_was(bad):  # type: ignore[no-untyped-def]
    cache = make_cache(attention_spec())
    insert_all(cache, seq(0, 4))
    before = _fingerprint(cache)
    with pytest.raises(ValueError):
        bad(cache)
    # The tree took nothing: same nodes, same cached (evictable) pages. Pages the failing call
    # allocated for itself are still the caller's (used), not leaked into the tree.
    after = _fingerprint(cache)
    assert after[0] == before[0]
    assert [u.evictable for u in after[1]] == [u.evictable for u in before[1]]
    cache.check_integrity()


def test_request_larger_than_the_pool_names_sizes_and_changes_nothing():
    cache = make_cache(attention_spec(), budget=16 * 10)
    insert_all(cache, seq(0, 6))
    before = _fingerprint(cache)
    with pytest.raises(OutOfMemory, match=r"11 kv\[0\] pages \(176 bytes\).*160 bytes"):
        cache.allocate_kv(11, owner=1)
    assert _fingerprint(cache) == before
    cache.check_integrity()


def test_flop_aware_drop_state_merges_kv_into_child():
    cache = make_cache(hybrid_spec(), eviction=FlopAwareEviction(alpha=0.0))
    insert_all(cache, seq(0, 10), (10,))
    insert_all(cache, seq(0, 4).concat(toks(90, 91)), (4, 6))
    upper = cache.tree.match(seq(0, 4)).node
    assert upper is not None and upper.state is not None
    cache.tree.evict_leaf(cache.tree.match(seq(0, 4).concat(toks(90, 91))).node)  # type: ignore[arg-type]
    assert len(upper.children) == 1
    child = next(iter(upper.children.values()))
    cache.tree.drop_state(upper)
    assert child.start == 0 and child.end == 10 and len(child.kv[0]) == 10
    assert cache.tree.match(seq(0, 10)).length == 10
    state_type = cache.tree.state_type
    assert state_type is not None and state_type.kind is PageKind.STATE
    assert memory(cache).usage(state_type).evictable == 1
    cache.check_integrity()


def _fingerprint(cache):  # type: ignore[no-untyped-def]
    nodes = sorted((n.start, n.end, n.lock_ref, n.state is not None) for n in cache.tree.nodes())
    usage = [memory(cache).usage(t) for t in memory(cache).page_types]
    return nodes, usage, memory(cache).held_bytes()


def _hybrid_swa_spec() -> ModelSpec:
    return ModelSpec("tiny-hybrid-swa", (attention(), attention(2, "swa"), mamba()), hidden_size=4)


def _insert_with_tombstones(cache, key: TokenSeq, states, dropped: int):  # type: ignore[no-untyped-def]
    """Insert `key` with its window group's first `dropped` new positions already dropped."""
    walk = cache.tree.walk(key)
    span = len(key) - walk.length
    full, swa = cache.tree.kv_types
    kv = [cache.memory.alloc(full, span, 0), cache.memory.alloc(swa, span - dropped, 0)]
    st = cache.allocate_states(len(states), owner=0)
    return cache.tree.insert(key, walk.length, kv, dict(zip(states, st, strict=True)), now=1)


def _shape(cache):  # type: ignore[no-untyped-def]
    return sorted(
        (n.start, n.end, n.id, n.state is not None, [len(p) for p in n.kv], list(n.tombstones))
        for n in cache.tree.nodes()
    )


def test_checkpoints_inside_a_new_leaf_give_the_chain_that_splitting_gives():
    """One insert with checkpoints inside its new leaf builds the nodes, pages, tombstones and
    ids that inserting the leaf and then splitting it at each checkpoint gives (a policy that
    does not evict runs: every checkpoint ends a node)."""
    key = seq(0, 10)
    direct = make_cache(_hybrid_swa_spec(), eviction=FlopAwareEviction())
    _insert_with_tombstones(direct, key, (3, 6, 10), dropped=4)
    stepwise = make_cache(_hybrid_swa_spec(), eviction=FlopAwareEviction())
    _insert_with_tombstones(stepwise, key, (10,), dropped=4)
    for at in (3, 6):
        _insert_with_tombstones(stepwise, key, (at,), dropped=0)
    assert _shape(direct) == _shape(stepwise)
    assert [(s, e) for s, e, *_ in _shape(direct)] == [(0, 3), (3, 6), (6, 10)]
    direct.check_integrity()
    stepwise.check_integrity()


def test_a_run_walked_through_is_the_chain():
    """With LRU (it evicts runs) the same insert keeps one leaf whose inner checkpoints stand
    for the chain; a walk through it cuts out the chain's nodes, pages, tombstones and ids."""
    key = seq(0, 10)
    chain = make_cache(_hybrid_swa_spec(), eviction=FlopAwareEviction())
    _insert_with_tombstones(chain, key, (3, 6, 10), dropped=4)
    runs = make_cache(_hybrid_swa_spec())
    leaf = _insert_with_tombstones(runs, key, (3, 6, 10), dropped=4)
    assert [at for at, _ in leaf.inner] == [3, 6] and (leaf.start, leaf.end) == (0, 10)
    runs.check_integrity()
    assert runs.tree.walk(seq(0, 5)).length == 5  # cuts [0, 3) and [3, 6): 5 lies in [3, 6)
    assert [(s, e) for s, e, *_ in _shape(runs)] == [(0, 3), (3, 6), (6, 10)]
    assert _shape(runs) == _shape(chain)
    runs.check_integrity()


def test_eviction_takes_a_run_apart_from_its_end():
    """A leaf run is evicted one segment at a time, last first, as the chain's leaves would
    be: each frees its pages and state and counts as an evicted node."""
    cache = make_cache(hybrid_spec())
    leaf = insert_all(cache, seq(0, 9), (3, 6, 9))
    state_type = cache.tree.state_type
    assert state_type is not None
    for end in (6, 3):
        assert cache.tree.evict_for(state_type)
        assert (leaf.end, len(leaf.kv[0]), len(leaf.inner)) == (end, end, end // 3 - 1)
        assert leaf.state is not None
        cache.check_integrity()
    assert cache.tree.evict_for(state_type)
    assert leaf.parent is None and not cache.tree.root.children
    assert (cache.tree.evicted_nodes, cache.tree.evicted_states) == (3, 3)
    assert memory(cache).held_bytes() == 0
    cache.check_integrity()


@pytest.mark.parametrize("count", [1, 3, 5, 9])
def test_byte_budget_alloc_each_is_one_page_at_a_time(count: int):
    """ByteBudget's single-allocation shortcut evicts and fails exactly as successive one-page
    allocations do (the generic CacheMemory.alloc_each), with and without enough room, and
    records the same peak."""
    outcomes = []
    for each in (ByteBudget.alloc_each, CacheMemory.alloc_each):
        cache = make_cache(hybrid_spec(), budget=600)
        for s in range(4):
            insert_all(cache, seq(100 * s, 6), states=(6,))
        state_type = cache.tree.state_type
        assert state_type is not None
        try:
            got = len(each(memory(cache), state_type, count, 0))
        except OutOfMemory:
            got = -1
        outcomes.append(
            (got, _shape(cache), memory(cache).usage(state_type), memory(cache).peak_bytes)
        )
        cache.check_integrity()
    assert outcomes[0] == outcomes[1]


def test_a_stateless_leaf_grows_instead_of_getting_a_child():
    # SGLang caches a running request's prefill KV (no state: hits end only at one) and, when
    # it finishes, the rest with the state. The tree must look as if both came in one insert.
    cache = make_cache(hybrid_spec())
    prefill = insert_all(cache, seq(0, 6))
    lock_before = prefill.lock_ref
    cache.tree.lock(prefill)  # the running request holds its prefix
    finished = insert_all(cache, seq(0, 10), (10,))
    assert finished is prefill and (finished.start, finished.end) == (0, 10)
    assert finished.state is not None and len(finished.kv[0]) == 10
    kv = cache.tree.kv_types[0]
    assert memory(cache).usage(kv).used == 10  # the new pages are locked like the old ones
    cache.tree.unlock(prefill)
    assert prefill.lock_ref == lock_before and memory(cache).usage(kv).evictable == 10
    assert cache.tree.match(seq(0, 12)).length == 10
    cache.check_integrity()


@pytest.mark.parametrize(
    ("spec", "states"),
    [(attention_spec(), ()), (hybrid_spec(), (6,))],
    ids=["attention-only: every prefix is a hit", "the leaf ends at a checkpoint"],
)
def test_leaves_whose_end_is_a_reuse_point_keep_it(spec, states):  # type: ignore[no-untyped-def]
    cache = make_cache(spec)
    first = insert_all(cache, seq(0, 6), states)
    second = insert_all(cache, seq(0, 10))
    assert second is not first and second.parent is first
    assert (first.end, second.start, second.end) == (6, 6, 10)
    cache.check_integrity()


@pytest.mark.parametrize("size", [0, 1, 4, 7])
def test_a_truncated_sequence_behaves_like_the_copied_prefix(size: int):
    """`truncated` shares the bytes of the longer sequence; nothing can tell it from a copy."""
    full = seq(10, 7)
    view, copy = full.truncated(size), full.slice(0, size)
    assert (len(view), view.packed, view.tolist()) == (len(copy), copy.packed, copy.tolist())
    assert view == copy and hash(view) == hash(copy)
    assert view.concat(toks(1)) == copy.concat(toks(1))
    assert view.slice(1) == copy.slice(1) and view.truncated(2) == copy.truncated(2)
    for other in (full, seq(10, 3).concat(toks(99)), toks()):
        for offset in (0, 1):
            assert view.common_prefix(other, offset) == copy.common_prefix(other, offset)
            assert other.common_prefix(view) == other.common_prefix(copy)
    if size:
        assert view[-1] == copy[-1] and view.head(size - 1) == copy.head(size - 1)
        with pytest.raises(IndexError):
            view[size]


@pytest.mark.parametrize("typecode", ["q", "l", "i", "I", "H"])
def test_token_ids_from_integer_arrays_pack_like_lists(typecode: str) -> None:
    from array import array

    ids = [0, 7, 65535, 3, 9]
    assert TokenSeq.of(array(typecode, ids)) == TokenSeq.of(ids)  # SGLang passes array("q")
    assert len(TokenSeq.of(array(typecode))) == 0


@pytest.mark.parametrize("bad", [[4, -1], [2**31], ["a"]])
def test_token_ids_out_of_int32_range_are_refused(bad: list[object]) -> None:
    from array import array

    with pytest.raises(ValueError, match="token ids must be"):
        TokenSeq.of(bad)  # type: ignore[arg-type]
    if isinstance(bad[0], int):
        with pytest.raises(ValueError, match="token ids must be"):
            TokenSeq.of(array("q", bad))  # type: ignore[arg-type]
