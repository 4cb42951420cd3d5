"""KV events of the jenga cache (binding/slots/kv_events.py) over SGLang's CPU pools.

A router that follows the events holds exactly the blocks of the paths that end at a
checkpoint (Mamba) or at a KV page (attention only), after any mix of inserts and evictions:
the stream is replayed into a model of the router's index (bench/drivers/kv_index.py, strict)
and compared with the tree itself.
KV past the last checkpoint is never published, since no hit can end in it.
"""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from jenga_sglang.bench.drivers.kv_index import BlockIndex

pytestmark = pytest.mark.sglang

SHARED = [7 + (3 * i) % 50 for i in range(40)]


def _setup(mamba: bool) -> tuple[Any, Any, Any]:
    from test_binding_backend import _cache

    from jenga_sglang.binding.slots.kv_events import attach

    cache, allocator, req_pool = _cache(_sg(), mamba)
    events = attach(cache, True)
    assert events is not None
    return cache, allocator, req_pool


def _sg() -> Any:
    from types import SimpleNamespace

    from sglang.srt.mem_cache import base_prefix_cache as bpc
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return SimpleNamespace(bpc=bpc, RadixKey=RadixKey)


def _key(tokens: list[int], salt: str | None = None) -> Any:
    return _sg().RadixKey(array("q", tokens), cache_salt=salt)


def _insert(
    cache: Any, allocator: Any, req_pool: Any, tokens: list[int], state: bool, salt: Any = None
) -> None:
    bpc = _sg().bpc
    slots = allocator.alloc(len(tokens))
    mamba = req_pool.mamba_allocator.alloc(1) if state else None
    done = cache.insert(bpc.InsertParams(key=_key(tokens, salt), value=slots, mamba_value=mamba))
    allocator.free(slots[: done.prefix_len])
    if mamba is not None and done.mamba_exist:
        req_pool.mamba_allocator.free(mamba)


def _all_nodes(cache: Any) -> list[Any]:
    """The tree's device nodes and, with the host tier, its host nodes."""
    host = cache.cache.host
    return [*cache.cache.nodes(), *(host.host_nodes() if host is not None else ())]


def _usable_paths(cache: Any) -> set[tuple[int, ...]]:
    """Every prefix of every path that ends at a checkpoint (a node's or one inside a run, on
    the device or in host memory: a load-back serves the latter), or at any node without a
    Mamba group: what a router may count as a hit."""
    out: set[tuple[int, ...]] = set()
    for node in _all_nodes(cache):
        if node.parent is None:
            continue
        path = tuple(t for n in node.path_from_root() for t in n.key.tolist())
        ends = [p for p, _ in node.inner]
        if cache.state_type is None or node.state is not None or node.host_state is not None:
            ends.append(node.end)
        for end in ends:
            out.update(path[: i + 1] for i in range(end))
    return out


def test_mamba_spans_end_at_checkpoints_and_go_with_them() -> None:
    cache, allocator, req_pool = _setup(mamba=True)
    router = BlockIndex(strict=True)
    first = [*SHARED, 60, 61]
    _insert(cache, allocator, req_pool, first, state=True)
    stored = cache.take_events()
    assert [type(e).__name__ for e in stored] == ["BlockStored"]
    assert stored[0].token_ids == first and stored[0].parent_block_hash is None
    assert stored[0].medium == "GPU"  # the tier, as SGLang's own stores name it
    router.apply(stored)
    _insert(cache, allocator, req_pool, [*first, 70, 71, 72], state=False)  # KV, no state
    assert cache.take_events() == []  # no hit can end there: nothing published
    _insert(cache, allocator, req_pool, [*SHARED, 80, 81, 82], state=True)
    branch = cache.take_events()
    assert len(branch) == 1 and branch[0].token_ids == [80, 81, 82]
    assert branch[0].parent_block_hash == stored[0].block_hashes[39]  # under the shared head
    router.apply(branch)
    assert router.paths() == _usable_paths(cache)
    assert router.predicted_hit([*first, 70, 99]) == 42
    hit = cache.match_prefix(_sg().bpc.MatchPrefixParams(key=_key([*first, 70, 99])))
    assert hit.device_prefix_len == 42  # the router's prediction is the worker's hit
    for n in (30, 400):  # evictions: states go (and their KV), spans are removed
        cache.evict(_sg().bpc.EvictParams(num_tokens=n))
        router.apply(cache.take_events())
        assert router.paths() == _usable_paths(cache)
        cache.kv_events.check_integrity()
    assert not router.blocks and cache.kv_events.published() == 0


def test_attention_only_every_page_is_published_until_evicted() -> None:
    cache, allocator, req_pool = _setup(mamba=False)
    router = BlockIndex(strict=True)
    _insert(cache, allocator, req_pool, [*SHARED, 1, 2], state=False)
    _insert(cache, allocator, req_pool, [*SHARED, 3], state=False)
    router.apply(cache.take_events())
    assert router.paths() == _usable_paths(cache) and len(router.blocks) == 43
    cache.evict(_sg().bpc.EvictParams(num_tokens=2))
    router.apply(cache.take_events())
    assert router.paths() == _usable_paths(cache) and len(router.blocks) < 43


def test_a_decode_workers_tree_publishes_every_page_as_attention_only_does() -> None:
    """A PD decode worker's tree (`states_from_peer`): its hits need the KV alone, so every
    page is published, though the model has Mamba layers."""
    from test_binding_backend import _params

    from jenga_sglang.binding.cache.backend import JengaRadixCache
    from jenga_sglang.binding.options import JengaOptions
    from jenga_sglang.binding.slots.kv_events import attach
    from jenga_sglang.models import get_spec
    from jenga_sglang.models.spec import states_from_peer

    params = _params(True, 256)
    spec = states_from_peer(get_spec("nemotron-h-8b"))
    cache = JengaRadixCache(params, spec, JengaOptions(enabled=True))
    assert attach(cache, True) is not None and cache.state_type is not None
    allocator, req_pool = params.token_to_kv_pool_allocator, params.req_to_token_pool
    router = BlockIndex(strict=True)
    _insert(cache, allocator, req_pool, [*SHARED, 1, 2], state=False)
    _insert(cache, allocator, req_pool, [*SHARED, 3], state=False)
    router.apply(cache.take_events())
    assert len(router.blocks) == 43 and router.predicted_hit([*SHARED, 3, 9]) == 41
    hit = cache.match_prefix(_sg().bpc.MatchPrefixParams(key=_key([*SHARED, 3, 9])))
    assert hit.device_prefix_len == 41  # the prediction is the worker's hit
    cache.evict(_sg().bpc.EvictParams(num_tokens=2))
    router.apply(cache.take_events())
    assert len(router.blocks) == 41


def test_namespaces_publish_blocks_of_their_own() -> None:
    cache, allocator, req_pool = _setup(mamba=True)
    first = [*SHARED, 60, 61]
    _insert(cache, allocator, req_pool, first, state=True)
    _insert(cache, allocator, req_pool, first, state=True, salt="tenant-b")
    plain, salted = cache.take_events()
    assert plain.token_ids == salted.token_ids == first  # the same tokens, two namespaces:
    assert not set(plain.block_hashes) & set(salted.block_hashes)  # two sets of blocks
    assert cache.kv_events.published() == 2 * len(first)


def test_stores_name_their_namespace_as_sglang_does() -> None:
    """A store says its cache salt, and its LoRA adapter's public name once SGLang's table
    knows it (the scheduler registers it as requests arrive), as SGLang's own events do."""
    from sglang.srt.mem_cache.events import KvEventLoraNames
    from test_binding_backend import _cache

    from jenga_sglang.binding.cache.namespaces import event_labels
    from jenga_sglang.binding.slots.kv_events import attach

    cache, allocator, req_pool = _cache(_sg(), True)
    names = KvEventLoraNames()
    lora_id = "0123456789abcdef0123456789abcdef"  # SGLang appends it to the extra key
    names.register(lora_id=lora_id, lora_name="adapter-a")
    attach(cache, True, event_labels(names))
    bpc = _sg().bpc
    keys = [
        _sg().RadixKey(array("q", SHARED), cache_salt="tenant-b"),
        _sg().RadixKey(array("q", SHARED), extra_key="sys" + lora_id),
        _sg().RadixKey(array("q", SHARED), extra_key="sys" + lora_id, cache_salt="t"),
        _sg().RadixKey(array("q", SHARED), extra_key="no-adapter"),
        _sg().RadixKey(array("q", SHARED)),
    ]
    for key in keys:
        slots = allocator.alloc(len(SHARED))
        state = req_pool.mamba_allocator.alloc(1)
        cache.insert(bpc.InsertParams(key=key, value=slots, mamba_value=state))
    stores = cache.take_events()
    assert [(e.cache_salt, e.lora_name) for e in stores] == [
        ("tenant-b", None),
        (None, "adapter-a"),
        ("t", "adapter-a"),
        (None, None),
        (None, None),
    ]
    assert len({h for e in stores for h in e.block_hashes}) == 5 * len(SHARED)


def test_a_namespace_string_gives_back_sglangs_pair() -> None:
    from jenga_sglang.binding.cache.namespaces import namespace_of, namespace_pair

    for pair in [(None, None), ("", None), (None, "s"), ("a", "b"), ("a'\"b", "c,)")]:
        assert namespace_pair(namespace_of(*pair)) == pair
    with pytest.raises(ValueError, match="not a namespace"):
        namespace_pair("'x'")


def _window_usable_paths(cache: Any) -> set[tuple[int, ...]]:
    """Every prefix of every path to a node end whose window the tree holds (a hit there
    keeps every group's rule), in whole pages: what a router may count on a sliding-window
    model."""
    from jenga_sglang.radix.rules import longest_common_valid

    rules, page, out = cache.cache.tree.rules, cache.page_size, set()
    for node in _all_nodes(cache):
        if node.parent is None:
            continue
        path = node.path_from_root()
        if longest_common_valid(rules, path, node.end) == node.end:
            tokens = tuple(t for n in path for t in n.key.tolist())
            out.update(tokens[: (i + 1) * page] for i in range(node.end // page))
    return out


@pytest.mark.parametrize("page", [1, 4])
def test_window_spans_end_where_the_window_is_held(page: int) -> None:
    """gpt-oss's layout: spans end at node ends whose last w tokens' window KV the tree holds;
    trims never take a published span's window, and full-KV evictions remove it."""
    from swa_session import SwaSession

    from jenga_sglang.binding.slots.kv_events import attach

    def toks(base: int, n: int) -> list[int]:
        return [base + (7 * i) % 97 for i in range(n)]

    s = SwaSession(page=page, full=2048, swa=96, chunk=32)  # 96 window slots: trims
    assert attach(s.cache, True) is not None
    router = BlockIndex(strict=True)

    def synced() -> None:
        router.apply(s.cache.take_events())
        assert router.paths() == _window_usable_paths(s.cache)
        s.cache.kv_events.check_integrity()

    prompts = [toks(1000 * (k + 1), 30) for k in range(6)]
    for p in prompts:
        s.serve(p, toks(50, 2))
        synced()
    slot = s.cache.slot_tree.window_slot
    assert any(n.tombstones[slot] for n in s.cache.cache.nodes())  # the window pool trimmed
    for p in prompts:  # a next turn: the router predicts the worker's hit exactly
        turn = [*p, 50, 9]
        predicted = router.predicted_hit(turn)
        assert predicted == s.serve(turn, toks(60, 2)) == 31 - 31 % page
        synced()
    # SGLang's own insert hands over only the positions the tree lacks: through a trimmed
    # edge, neither the branch point nor the new end has its window, so nothing is published
    bpc, key = _sg().bpc, [*prompts[1][:20], 5, 5, 5, 5]
    value = _fresh_slots(s, len(key))  # (which may evict)
    synced()
    done = s.cache.insert(bpc.InsertParams(key=_key(key), value=value))
    assert done.prefix_len == 20 and s.cache.take_events() == []
    s.alloc.free(value[: done.prefix_len])
    synced()
    branch = [*prompts[0][:20], 7, 7]  # inside a trimmed edge: the router over-predicts,
    predicted = router.predicted_hit(branch)  # by less than the way back to a node end
    got = s.serve(branch, toks(70, 2))
    assert got <= predicted and predicted - got < 32
    synced()
    for n in (40, 4000):  # full KV evicted: its spans go
        s.cache.evict(_sg().bpc.EvictParams(num_tokens=n))
        synced()
    assert not router.blocks and s.cache.kv_events.published() == 0


def _fresh_slots(s: Any, n: int) -> Any:
    """`n` new full slots (with window slots) the scheduler's way, evicting if short."""
    import torch

    if s.page == 1:
        return s.allocation.alloc_token_slots(s.cache, n)
    zero, seq = torch.tensor([0]), torch.tensor([n])
    last = torch.tensor([-1], dtype=torch.int64)
    return s.allocation.alloc_paged_token_slots_extend(s.cache, zero, zero, seq, seq, last, n)


def test_the_router_model_keeps_a_block_while_either_tier_holds_it() -> None:
    """smg 1.13's index, as BlockIndex models it: a block stored on the device and then on
    host stays routable when its device copy is removed, and goes with its last copy; a copy
    on disk is not indexed. A medium-blind index would lose it at the device removal."""
    from sglang.srt.disaggregation.kv_events import BlockRemoved, BlockStored

    def stored(medium: str | None) -> Any:
        return BlockStored(
            block_hashes=[11, 12], parent_block_hash=None, token_ids=[5, 6],
            block_size=1, lora_id=None, medium=medium,
        )  # fmt: skip

    router = BlockIndex(strict=True)
    router.apply([stored("GPU"), stored("CPU_PINNED"), stored("DISK")])
    assert router.on("device") == router.on("host") == {11, 12}
    router.apply([BlockRemoved(block_hashes=[11, 12], medium="GPU")])
    assert router.predicted_hit([5, 6, 7]) == 2 and router.on("device") == set()
    router.apply([BlockRemoved(block_hashes=[12], medium="CPU_PINNED")])
    assert router.predicted_hit([5, 6, 7]) == 1
    router.apply([BlockRemoved(block_hashes=[11], medium="CPU_PINNED")])
    assert not router.blocks and not router.copies
    with pytest.raises(AssertionError, match="lacks"):  # strict: a copy it never had
        router.apply([BlockRemoved(block_hashes=[11], medium="GPU")])
