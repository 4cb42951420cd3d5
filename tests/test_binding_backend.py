"""JengaRadixCache through SGLang's calls, on SGLang's own CPU pools (real sglang 0.5.23).

The pools are SGLang's own (TokenToKVPoolAllocator, HybridReqToTokenPool, HybridLinearKVPool)
on device="cpu", built the way its unified-radix-cache kit builds them.
"""

from __future__ import annotations

from array import array
from dataclasses import replace
from typing import Any

import pytest

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def sg() -> Any:
    from types import SimpleNamespace

    import torch
    from sglang.srt.mem_cache import base_prefix_cache as bpc
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return SimpleNamespace(torch=torch, bpc=bpc, RadixKey=RadixKey)


def _params(mamba: bool, kv_size: int, extra_buffer: bool = False) -> Any:
    """SGLang's own CPU pools and allocator for a small model (6 attention of 24 layers).

    `extra_buffer`: `--mamba-radix-cache-strategy extra_buffer` with overlap scheduling (two
    ping-pong track slots per request, so each request holds three Mamba slots: a larger
    pool), decode states tracked every 128 tokens (`--mamba-track-interval 128`), and room
    for sequences that cross it."""
    import torch
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import (
        HybridLinearKVPool,
        HybridReqToTokenPool,
        MHATokenToKVPool,
        ReqToTokenPool,
    )
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    args = ServerArgs(model_path="dummy", page_size=1, mamba_track_interval=128)
    args._mamba_cache_chunk_size = 64  # the dummy model has no HF config to read it from
    set_global_server_args_for_scheduler(args)
    attn = [3, 7, 11, 15, 19, 23]
    kv = dict(size=kv_size, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=16)
    if mamba:
        other = [i for i in range(24) if i not in attn]
        shape = Mamba2StateShape.create(
            tp_world_size=1,
            intermediate_size=64,
            n_groups=1,
            num_heads=2,
            head_dim=16,
            state_size=8,
            conv_kernel=4,
        )
        # One conv window per draft step (SGLang's layout for draft trees and its CPU engine;
        # its default for chains overlaps them), so an emulated verify writes each step's own.
        shape = replace(shape, disable_conv_window_dedup=True)
        req_pool = HybridReqToTokenPool(
            size=8,
            mamba_size=16 if extra_buffer else 6,
            mamba_spec_state_size=8,
            max_context_len=512 if extra_buffer else 128,
            device="cpu",
            enable_memory_saver=False,
            cache_params=Mamba2CacheParams(shape=shape, layers=other),
            mamba_layer_ids=other,
            enable_mamba_extra_buffer=extra_buffer,
            enable_overlap_schedule=True,
            speculative_num_draft_tokens=3,
        )
        pool = HybridLinearKVPool(
            **kv,
            full_attention_layer_ids=attn,
            device="cpu",
            enable_memory_saver=False,
            mamba_pool=req_pool.mamba_pool,
        )
    else:
        req_pool = ReqToTokenPool(
            size=8, max_context_len=128, device="cpu", enable_memory_saver=False
        )
        pool = MHATokenToKVPool(**kv, layer_num=6, device="cpu", enable_memory_saver=False)
    allocator = TokenToKVPoolAllocator(
        size=kv_size, dtype=torch.bfloat16, device="cpu", kvcache=pool, need_sort=False
    )
    return CacheInitParams(
        disable=False,
        req_to_token_pool=req_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=1,
        enable_mamba_extra_buffer=extra_buffer,
    )


def _cache(sg: Any, mamba: bool, kv_size: int = 256, **opts: Any) -> tuple[Any, Any, Any]:
    from jenga_sglang.binding.cache.backend import JengaRadixCache
    from jenga_sglang.binding.options import SERVER_POLICY, JengaOptions
    from jenga_sglang.models import get_spec

    params = _params(mamba, kv_size)
    spec = get_spec("nemotron-h-8b" if mamba else "marconi-7b")
    if not mamba:
        spec = _attention_only(spec)
    cache = JengaRadixCache(
        params, spec, JengaOptions(enabled=True, policy=replace(SERVER_POLICY, **opts))
    )
    return cache, params.token_to_kv_pool_allocator, params.req_to_token_pool


def _attention_only(spec: Any) -> Any:
    from jenga_sglang.models.spec import ModelSpec

    groups = tuple(g for g in spec.groups if g not in spec.mamba_groups)
    return ModelSpec(spec.name + "-attn", groups, spec.hidden_size)


def _key(sg: Any, tokens: list[int]) -> Any:
    return sg.RadixKey(array("q", tokens))


def _insert(sg: Any, cache: Any, allocator: Any, tokens: list[int], state: Any = None) -> Any:
    slots = allocator.alloc(len(tokens))
    result = cache.insert(sg.bpc.InsertParams(key=_key(sg, tokens), value=slots, mamba_value=state))
    if result.prefix_len:  # SGLang's convention: the caller frees its duplicates
        allocator.free(slots[: result.prefix_len])
    return result, slots


def _match(sg: Any, cache: Any, tokens: list[int]) -> Any:
    return cache.match_prefix(sg.bpc.MatchPrefixParams(key=_key(sg, tokens)))


def test_full_attention_hits_and_slots(sg: Any) -> None:
    cache, allocator, _ = _cache(sg, mamba=False)
    free0 = allocator.available_size()
    r1, s1 = _insert(sg, cache, allocator, [1, 2, 3, 4, 5])
    assert r1.prefix_len == 0
    r2, s2 = _insert(sg, cache, allocator, [1, 2, 3, 9, 9, 9])
    assert r2.prefix_len == 3
    hit = _match(sg, cache, [1, 2, 3, 9, 7])
    assert hit.device_prefix_len == 4
    path = cache.path_device_indices(hit.last_device_node)
    assert path[:4].tolist() == s1[:3].tolist() + s2[3:4].tolist()
    assert allocator.available_size() == free0 - 8  # 5 + 3 new slots held by the tree
    cache.sanity_check()


def test_lock_protects_and_evict_returns_slots(sg: Any) -> None:
    cache, allocator, _ = _cache(sg, mamba=False)
    free0 = allocator.available_size()
    _insert(sg, cache, allocator, [1, 2, 3, 4])
    _insert(sg, cache, allocator, [1, 2, 7, 8, 9])
    node = _match(sg, cache, [1, 2, 7, 8, 9]).last_device_node
    lock = cache.lock(node)
    assert cache.protected_size() == 5 and cache.evictable_size() == 2
    evicted = cache.evict(sg.bpc.EvictParams(num_tokens=100))
    assert evicted.num_tokens_evicted == 2  # only the unlocked leaf [3, 4]
    assert _match(sg, cache, [1, 2, 3, 4]).device_prefix_len == 2
    cache.unlock(lock)
    assert cache.evict(sg.bpc.EvictParams(num_tokens=100)).num_tokens_evicted == 5
    assert allocator.available_size() == free0
    cache.sanity_check()


def test_mamba_hits_end_at_checkpoints(sg: Any) -> None:
    cache, allocator, req_pool = _cache(sg, mamba=True, admission="speculative")
    states0 = req_pool.mamba_allocator.available_size()
    state = req_pool.mamba_allocator.alloc(1)
    r, _ = _insert(sg, cache, allocator, list(range(1, 11)), state=state)
    assert not r.mamba_exist and cache.mamba_evictable_size() == 1
    assert _match(sg, cache, [*range(1, 11), 99]).device_prefix_len == 10
    # No checkpoint at 6: a request sharing 6 tokens gets no hit, and the admission asks
    # SGLang to capture the state exactly at the branch point.
    other = [1, 2, 3, 4, 5, 6, 50, 51]
    miss = _match(sg, cache, other)
    assert miss.device_prefix_len == 0
    assert miss.mamba_branching_seqlen == 6
    # 'jenga' admission skips a 6-token branch: one state weighs far more than 6 tokens of KV.
    jenga, jalloc, jpool = _cache(sg, mamba=True)
    _insert(sg, jenga, jalloc, list(range(1, 11)), state=jpool.mamba_allocator.alloc(1))
    assert _match(sg, jenga, other).mamba_branching_seqlen is None
    cache.evict(sg.bpc.EvictParams(num_tokens=100, mamba_num=1))
    assert req_pool.mamba_allocator.available_size() == states0
    cache.sanity_check()


def test_duplicate_state_is_refused(sg: Any) -> None:
    cache, allocator, req_pool = _cache(sg, mamba=True)
    tokens = [5, 6, 7, 8]
    _insert(sg, cache, allocator, tokens, state=req_pool.mamba_allocator.alloc(1))
    r, _ = _insert(sg, cache, allocator, tokens, state=req_pool.mamba_allocator.alloc(1))
    assert r.prefix_len == 4 and r.mamba_exist


def test_a_sibling_state_at_the_same_depth_is_no_duplicate(sg: Any) -> None:
    """A new sequence ending where a diverging sibling has its checkpoint (same length, other
    tokens) keeps its own state: the sibling's is on another path."""
    cache, allocator, req_pool = _cache(sg, mamba=True)
    _insert(sg, cache, allocator, [5, 6, 7, 8], state=req_pool.mamba_allocator.alloc(1))
    r, _ = _insert(sg, cache, allocator, [5, 6, 9, 9], state=req_pool.mamba_allocator.alloc(1))
    assert r.prefix_len == 2 and not r.mamba_exist
    assert _match(sg, cache, [5, 6, 9, 9, 1]).device_prefix_len == 4
    cache.sanity_check()


def test_two_caches_same_trace_same_decisions(sg: Any) -> None:
    """Tensor-parallel ranks: identical call streams give identical hits and evictions."""
    import random

    rng = random.Random(7)
    trace = [[rng.randrange(4) for _ in range(rng.randrange(3, 12))] for _ in range(60)]
    logs = []
    for _ in range(2):
        cache, allocator, _ = _cache(sg, mamba=False, kv_size=64)
        log = []
        for tokens in trace:
            hit = _match(sg, cache, tokens)
            if allocator.available_size() < len(tokens):
                log.append(("evict", cache.evict(sg.bpc.EvictParams(num_tokens=len(tokens)))))
            r, _ = _insert(sg, cache, allocator, tokens)
            log.append((hit.device_prefix_len, r.prefix_len, cache.evictable_size()))
        cache.sanity_check()
        logs.append(log)
    assert logs[0] == logs[1]
    assert any(entry[0] == "evict" for entry in logs[0])


@pytest.fixture()
def unified(sg: Any) -> Any:
    """Our backend (LRU) on SGLang's unified pool (--enable-unified-memory, no_buffer) of
    6 marconi-7b states' bytes: one state = 408.75 tokens of KV, and SGLang reserves one
    state's bytes, so an empty pool can hand out 2043 KV tokens or 4 states."""
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    from jenga_sglang.bench.drivers import sglang_pools
    from jenga_sglang.bench.drivers.sglang_split import SglangSplit
    from jenga_sglang.binding.cache.backend import JengaRadixCache
    from jenga_sglang.binding.options import SERVER_POLICY, JengaOptions
    from jenga_sglang.models import get_spec

    spec = get_spec("marconi-7b")
    state, kv = spec.state_bytes, spec.kv_bytes_per_token
    split = SglangSplit(
        6 * state, kv_tokens=1000, mamba_slots=1, kv_bytes_per_token=kv, state_bytes=state
    )
    sglang_pools.server_args(unified=True, extra_buffer=False)
    pools = sglang_pools.unified_pools(spec, split, 4096, extra_buffer=False)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool_allocator=pools.allocator,
        page_size=1,
    )
    lru = replace(SERVER_POLICY, eviction="lru")
    cache = JengaRadixCache(params, spec, JengaOptions(enabled=True, policy=lru))
    return cache, pools.allocator, pools.req_to_token_pool.mamba_allocator


@pytest.mark.parametrize("path", ["ensure_mamba_capacity", "branch fork"])
def test_unified_pool_state_admission_evicts_kv(sg: Any, unified: Any, path: str) -> None:
    cache, allocator, mamba = unified
    assert (allocator.available_size(), mamba.schedulable_available_size()) == (2043, 4)
    old = list(range(10_000, 11_000))  # KV without a state (a prefill cached mid-request)
    _insert(sg, cache, allocator, old)
    chat = list(range(1, 301))
    _insert(sg, cache, allocator, chat, state=mamba.alloc(1))
    # 1300 tokens + 1 state leave 2043 - 1300 - 408.75 = 334 tokens of bytes: no state fits.
    assert (allocator.available_size(), mamba.schedulable_available_size()) == (334, 0)
    if path == "ensure_mamba_capacity":  # SGLang's alloc_req_slots asks for the shortfall
        result = cache.evict_for_alloc(sg.bpc.EvictParams(num_tokens=0, mamba_num=1))
        assert (result.num_tokens_evicted, result.mamba_num_evicted) == (1000, 0)
        slot = mamba.alloc(1)
    else:  # our admission forks the live state at a branch point into a fresh slot
        slot = cache.handover.try_alloc_slot()
    # LRU's victim is the older entry; its 1000 tokens of bytes hold a state, so the
    # checkpointed chat stays (asking for freed *state slots* would have evicted it too).
    assert slot is not None
    assert cache.evictable_size() == 300 and cache.mamba_evictable_size() == 1
    assert _match(sg, cache, [*chat, 7]).device_prefix_len == 300
    r, _ = _insert(sg, cache, allocator, [*chat, *range(500, 600)], state=slot)
    assert r.prefix_len == 300 and not r.mamba_exist  # the state was admitted
    assert _match(sg, cache, [*chat, *range(500, 600), 7]).device_prefix_len == 400
    assert cache.mamba_evictable_size() == 2
    cache.sanity_check()


def test_unified_pool_kv_allocation_drops_one_state(sg: Any, unified: Any) -> None:
    cache, allocator, _ = unified
    chats = [list(range(k * 1000, k * 1000 + 200)) for k in range(1, 5)]
    for tokens in chats:  # 4 x (200 tokens + 1 state) = 2435 tokens of bytes: full after 3
        _insert(sg, cache, allocator, tokens, state=cache.handover.try_alloc_slot())
    # The fourth state evicted the first chat (LRU) whole: 3 chats are left, and
    # 2043.75 - 600 - 3 x 408.75 = 217.5 tokens of bytes.
    assert cache.evictable_size() == 600 and cache.mamba_evictable_size() == 3
    assert allocator.available_size() == 217
    need = allocator.available_size() + 300
    result = cache.evict_for_alloc(sg.bpc.EvictParams(num_tokens=300))
    # One chat (200 tokens + a state = 608.75 tokens of bytes) covers 300 tokens.
    assert (result.num_tokens_evicted, result.mamba_num_evicted) == (200, 1)
    assert allocator.available_size() >= need
    assert _match(sg, cache, [*chats[3], 1]).device_prefix_len == 200
    cache.sanity_check()
