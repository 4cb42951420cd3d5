"""The Jenga pool behind SGLang 0.5.23's own pool objects, on device="cpu".

KV goes through SGLang's HybridLinearKVPool (set_kv_buffer / get_key_buffer / get_value_buffer)
and states through its Mamba pool API (mamba2_layer_cache, clear_slots, copy_from); both must be
the bytes of our one buffer, read back through our layout views, and the other way round. The
allocators are checked against SGLang's allocator contracts and our pool's conservation law.

From sglang/test/unified_allocator_fixtures.py we use `setup_allocator_context` (SGLang's CPU
context for allocator tests) and `build_tri_pool`'s Mamba shape (conv (3, 8) bf16, temporal
(1, 4, 8) fp32). Its other helpers do not apply: `build_swa_pool` / `build_swa_cache` /
`build_tri_cache` build sliding-window composites and `UnifiedRadixCache` trees (the Jenga pool
serves full attention + Mamba with our own tree), and `FakeKVCache` records the physical page
moves of compaction, which the Jenga pool never does.
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.sglang

ATTN = (0, 2)  # full-attention layer ids
MAMBA = (1, 3)  # Mamba layer ids


@pytest.fixture(scope="module")
def sg() -> Any:
    import torch
    from sglang.srt.mem_cache import base_prefix_cache as bpc
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.test.unified_allocator_fixtures import setup_allocator_context

    setup_allocator_context()
    return SimpleNamespace(torch=torch, bpc=bpc, RadixKey=RadixKey)


def _cache_params(sg: Any) -> Any:
    return SimpleNamespace(
        shape=SimpleNamespace(conv=[(3, 8)], temporal=(1, 4, 8)),
        dtype=SimpleNamespace(conv=sg.torch.bfloat16, temporal=sg.torch.float32),
        layers=list(MAMBA),
    )


def _pools(
    sg: Any,
    kv_tokens: int = 64,
    states: int = 6,
    reserve: int = 2,
    rows: int = 4,
    page_size: int = 1,
    draft_tokens: int | None = None,
    heads: int = 2,
    head_dim: int = 8,
    decode: int | None = None,
) -> Any:
    """Our pools over SGLang's pool objects; with `decode`, a PD decode worker's request pool
    with that many pre-allocation rows (binding/pools/decode_pool.py)."""
    from jenga_sglang.binding.pools.build import (
        KVShape,
        build_jenga_pools,
        static_split_bytes,
        storage_spec,
    )

    kv = KVShape(ATTN, head_num=heads, head_dim=head_dim, dtype=sg.torch.bfloat16)
    params = _cache_params(sg)
    budget = static_split_bytes(storage_spec(kv, params), kv_tokens, states)
    req_rows: dict[str, Any] = {
        "size": rows,
        "max_context_len": 128,
        "enable_mamba_extra_buffer": False,
        "speculative_num_draft_tokens": draft_tokens,
    }
    extra: dict[str, Any] = {}
    if decode is None:
        req_rows["mamba_spec_state_size"] = rows
    else:
        from jenga_sglang.binding.pools.decode_pool import JengaHybridMambaDecodeReqToTokenPool

        req_rows |= {"pre_alloc_size": decode, "enable_overlap_schedule": False}
        extra["req_pool_class"] = JengaHybridMambaDecodeReqToTokenPool
    return build_jenga_pools(
        kv=kv,
        cache_params=params,
        mamba_layer_ids=MAMBA,
        budget_bytes=budget,
        state_reserve=reserve,
        device="cpu",
        req_pool_kwargs=req_rows,
        page_size=page_size,
        **extra,
    )


def _inside(layout: Any, tensor: Any) -> bool:
    start = layout.buffer.data_ptr()
    return start <= tensor.data_ptr() < start + layout.buffer.numel()


def _layer(layer_id: int) -> Any:
    return SimpleNamespace(layer_id=layer_id)


def test_kv_written_through_sglang_is_read_through_our_views(sg: Any) -> None:
    from jenga_sglang.binding.pools.build import KV_TYPE

    pools = _pools(sg)
    torch, layout = sg.torch, pools.layout
    kv_pool, allocator = pools.token_to_kv_pool, pools.token_to_kv_pool_allocator
    loc = allocator.alloc(5)
    k = torch.randn(5, 2, 8).bfloat16()
    v = torch.randn(5, 2, 8).bfloat16()
    kv_pool.set_kv_buffer(_layer(2), loc, k, v)  # SGLang's write path, global layer id 2
    assert torch.equal(kv_pool.get_key_buffer(2)[loc], k)
    assert torch.equal(kv_pool.get_value_buffer(2)[loc], v)
    ours = layout.kv[KV_TYPE][1]  # the second attention layer of our layout
    assert torch.equal(ours.k_slots[loc], k) and torch.equal(ours.v_slots[loc], v)
    # Page-major bytes: engine id i is pool page i - 1, [K_0 | V_0 | K_1 | V_1] of that token.
    raw = layout.page_bytes(KV_TYPE, int(loc[0]) - 1)
    assert torch.equal(raw[2 * 32 : 3 * 32].view(torch.bfloat16).view(2, 8), k[0])
    for buf in (kv_pool.get_key_buffer(0), kv_pool.get_value_buffer(2)):
        assert _inside(layout, buf) and buf.stride(0) * 2 == layout.geometry.of(KV_TYPE).page_bytes
    # And back: a write into our view is what SGLang reads.
    ours_first = layout.kv[KV_TYPE][0]
    ours_first.k_slots[loc] = k * 2
    assert torch.equal(kv_pool.get_key_buffer(0)[loc], k * 2)


def test_mamba_state_through_sglang_pool_is_our_bytes(sg: Any) -> None:
    from jenga_sglang.binding.pools.build import STATE_TYPE

    pools = _pools(sg)
    torch, layout = sg.torch, pools.layout
    req_pool = pools.req_to_token_pool
    a, b = (int(s) for s in req_pool.mamba_allocator.alloc(2))
    cache = req_pool.mamba2_layer_cache(MAMBA[1])  # SGLang's per-layer state view
    cache.temporal[a] = torch.arange(32, dtype=torch.float32).view(1, 4, 8)
    cache.conv[0][a] = torch.ones(3, 8, dtype=torch.bfloat16)
    ours = layout.state[STATE_TYPE]
    assert torch.equal(ours.temporal[1][a], cache.temporal[a])
    assert torch.equal(ours.conv[1][a], cache.conv[0][a])
    assert _inside(layout, cache.temporal) and _inside(layout, cache.conv[0])
    req_pool.copy_mamba_state(torch.tensor([a]), torch.tensor([b]))  # SGLang's COW copy
    assert torch.equal(ours.temporal_stacked[:, b], ours.temporal_stacked[:, a])
    ours.conv_stacked[0, b] = 5  # our write, SGLang's read
    assert bool((req_pool.mamba2_layer_cache(MAMBA[0]).conv[0][b] == 5).all())
    req_pool.mamba_pool.clear_slots(torch.tensor([a]))
    assert not ours.temporal_stacked[:, a].any() and ours.temporal_stacked[:, b].any()


def test_ngram_verify_scratch_sits_beside_the_pool_and_kv_moves_over_the_views(sg: Any) -> None:
    """With draft tokens (NGRAM), SGLang's speculative accessors find per-request scratch
    outside our buffer, one row per running request plus the padding row, dense per step;
    the states themselves stay our views. SGLang's accepted-token KV move copies over the
    views (the layout's bytes)."""
    from jenga_sglang.binding.pools.build import KV_TYPE

    pools = _pools(sg, rows=4, draft_tokens=3)
    torch, layout = sg.torch, pools.layout
    spec = pools.req_to_token_pool.get_speculative_mamba2_params_all_layers()
    assert spec.intermediate_ssm.shape == (len(MAMBA), 5, 3, 1, 4, 8)
    (window,) = spec.intermediate_conv_window
    assert window.shape == (len(MAMBA), 5, 3, 3, 8) and window.is_contiguous()
    assert not _inside(layout, spec.intermediate_ssm) and not _inside(layout, window)
    assert _inside(layout, spec.temporal) and _inside(layout, spec.conv[0])
    assert spec.conv[0].dtype == window.dtype == torch.bfloat16
    plain = _pools(sg, rows=4).req_to_token_pool.mamba_pool.mamba_cache
    assert not hasattr(plain, "intermediate_ssm")  # no drafts: no scratch

    kv_pool, allocator = pools.token_to_kv_pool, pools.token_to_kv_pool_allocator
    src, dst = allocator.alloc(3), allocator.alloc(3)
    k = torch.randn(3, 2, 8).bfloat16()
    kv_pool.set_kv_buffer(_layer(2), src, k, k * 2)
    kv_pool.move_kv_cache(dst, src)  # SGLang's entry point (full_kv_pool under the hybrid)
    ours = layout.kv[KV_TYPE][1]
    assert torch.equal(ours.k_slots[dst], k) and torch.equal(ours.v_slots[dst], k * 2)


def test_a_large_page_used_as_kv_is_reused_for_states_without_moving(sg: Any) -> None:
    from jenga_sglang.binding.pools.build import KV_TYPE, STATE_TYPE

    pools = _pools(sg, reserve=0)
    torch, layout, shared = sg.torch, pools.layout, pools.shared
    per_kv = layout.geometry.of(KV_TYPE).per_large
    allocator = pools.token_to_kv_pool_allocator
    loc = allocator.alloc(per_kv)  # exactly large page 0, carved as KV
    assert loc.tolist() == list(range(1, per_kv + 1))
    k = torch.full((per_kv, 2, 8), 3.0, dtype=torch.bfloat16)
    pools.token_to_kv_pool.set_kv_buffer(_layer(0), loc, k, k)
    allocator.free(loc)  # the last page of large page 0: it returns to the free list
    assert shared.pool.free_large_pages == shared.pool.num_large
    slot = pools.req_to_token_pool.mamba_allocator.alloc(1)
    page = int(slot[0]) - 1
    large = layout.geometry.large_page_bytes
    state_start = layout.sink_bytes + page * layout.geometry.of(STATE_TYPE).page_bytes
    assert state_start // large * large == layout.sink_bytes  # the same large page 0 ...
    raw = layout.page_bytes(STATE_TYPE, page)
    assert bool((raw.view(torch.bfloat16)[:16] == 3.0).all())  # ... KV's bytes still there
    pools.req_to_token_pool.mamba_pool.clear_slots(slot)  # SGLang clears a fresh state slot
    views = layout.state[STATE_TYPE]
    assert not views.conv_stacked[:, int(slot[0])].any()
    assert not views.temporal_stacked[:, int(slot[0])].any()  # (alignment padding is never read)
    shared.check_integrity()


def test_allocator_contract_and_conservation(sg: Any) -> None:
    from jenga_sglang.binding.pools.build import KV_TYPE, STATE_TYPE

    pools = _pools(sg, reserve=2)
    shared = pools.shared
    kv, mamba = pools.token_to_kv_pool_allocator, pools.req_to_token_pool.mamba_allocator
    geo = pools.layout.geometry
    per_kv, per_state = geo.of(KV_TYPE).per_large, geo.of(STATE_TYPE).per_large
    num_large = shared.pool.num_large
    reserve_large = -(-2 // per_state)
    assert kv.available_size() == (num_large - reserve_large) * per_kv == kv.size
    assert mamba.schedulable_available_size() == num_large * per_state
    assert mamba.size == num_large * per_state == mamba.available_size()
    got = kv.alloc(kv.available_size())
    assert got is not None and kv.alloc(1) is None  # the state reserve is not KV's
    assert kv.size == len(got) and kv.available_size() == 0
    kv.free_group_begin()  # SGLang's deferred frees: nothing reaches the pool until the end
    kv.free(got[:per_kv])  # large page 0, whole
    assert kv.available_size() == 0
    kv.flush_deferred_full_frees()  # what our backend calls before counting room
    assert kv.available_size() == per_kv and kv.free_group == []
    kv.free(got[per_kv:])
    kv.free_group_end()
    assert kv.available_size() == kv.size and shared.allocated(KV_TYPE) == 0
    states = mamba.alloc(2)  # states may use the reserve ...
    assert states is not None and mamba.available_size() == mamba.size - 2
    assert mamba.alloc(mamba.schedulable_available_size() + 1) is None  # nothing taken
    # ... and with no tree attached (no backend) the reserve is not netted against them.
    assert kv.available_size() == (num_large - reserve_large - -(-2 // per_state)) * per_kv
    shared.check_integrity()
    with pytest.raises(ValueError):
        kv.free(got[:1])  # double free
    mamba.alloc_group_begin(3)  # match_prefix's batched alloc: unused slots come back
    one = mamba.alloc(1)
    mamba.alloc_group_end()
    assert shared.allocated(STATE_TYPE) == 3 and one is not None
    mamba.clear()  # flush: every state goes, KV is untouched
    assert shared.allocated(STATE_TYPE) == 0
    shared.check_integrity()
    assert kv.mamba_full_cache_donor() is kv
    assert kv.alloc(1) is not None and shared.allocated(KV_TYPE) == 1


def _backend(sg: Any, pools: Any, eviction: str = "lru") -> Any:
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from jenga_sglang.binding.cache.backend import JengaRadixCache
    from jenga_sglang.binding.options import SERVER_POLICY, JengaOptions
    from jenga_sglang.binding.pools.build import storage_spec

    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=1))
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool_allocator=pools.token_to_kv_pool_allocator,
        page_size=1,
    )
    from jenga_sglang.binding.pools.build import KVShape

    spec = storage_spec(KVShape(ATTN, 2, 8, sg.torch.bfloat16), _cache_params(sg))
    policy = replace(SERVER_POLICY, eviction=eviction)
    return JengaRadixCache(params, spec, JengaOptions(enabled=True, policy=policy))


def _insert(sg: Any, cache: Any, pools: Any, tokens: list[int]) -> Any:
    slots = pools.token_to_kv_pool_allocator.alloc(len(tokens))
    state = pools.req_to_token_pool.mamba_allocator.alloc(1)
    key = sg.RadixKey(array("q", tokens))
    result = cache.insert(sg.bpc.InsertParams(key=key, value=slots, mamba_value=state))
    assert result.prefix_len == 0 and not result.mamba_exist
    return slots, state


def test_backend_on_the_jenga_pool_evicts_kv_for_a_state(sg: Any) -> None:
    """Our cache over the Jenga pool: entries fill the pool; a new state then evicts an entry
    (KV and state), and every slot id comes back to the one pool (conservation)."""
    pools = _pools(sg, kv_tokens=256, states=6, reserve=1)
    cache = _backend(sg, pools)
    shared, kv = pools.shared, pools.token_to_kv_pool_allocator
    entries = []
    while kv.available_size() >= 40 and shared.room(shared.state_type) >= 2:
        base = 1000 * len(entries)
        tokens = list(range(base, base + 40))
        entries.append((tokens, *_insert(sg, cache, pools, tokens)))
    assert len(entries) >= 2
    key = sg.RadixKey(array("q", entries[0][0]))
    hit = cache.match_prefix(sg.bpc.MatchPrefixParams(key=key))
    assert hit.device_prefix_len == 40  # a hit ends at the entry's state
    running = 0  # states of running requests, outside the tree
    while shared.room(shared.state_type) > 0:
        assert pools.req_to_token_pool.mamba_allocator.alloc(1) is not None
        running += 1
    before = cache.memory.evictable_count(cache.state_type)
    cache.evict_for_alloc(sg.bpc.EvictParams(num_tokens=0, mamba_num=1))
    assert shared.room(shared.state_type) >= 1
    assert cache.memory.evictable_count(cache.state_type) < before
    shared.check_integrity()
    cache.memory.check_integrity()
    # Every allocated slot is the tree's or a running request's; every freed one is back.
    assert cache.memory.held(cache.kv_type) == shared.allocated(shared.kv_type)
    assert cache.memory.held(cache.state_type) + running == shared.allocated(shared.state_type)


def _request(sg: Any, cache: Any, rid: int) -> Any:
    """A new SGLang request through match_prefix and `alloc_req_slots` (what the scheduler
    runs after PrefillAdder admitted it by KV tokens and the running-request count)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.allocation import alloc_req_slots
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(
        rid=str(rid),
        origin_input_text="",
        origin_input_ids=array("q", range(5000 + 100 * rid, 5010 + 100 * rid)),
        sampling_params=SamplingParams(temperature=0, max_new_tokens=1),
    )
    req.init_next_round_input(cache)
    alloc_req_slots(cache.req_to_token_pool, [req], cache)  # asserts on a missing state slot
    assert req.kv.holds_mamba
    return req


def test_kv_grows_into_the_reserve_requests_hold_and_new_requests_still_get_states(
    sg: Any,
) -> None:
    """4 running requests at most, no tracking slots: reserve 4 states. While requests hold
    states, KV takes every large page but the requests' (the un-netted reserve kept 4 more
    states closed); after a request finishes, by a free or by handing its state to the tree,
    a new one admitted by count still gets its slot (from the reserve, or by SGLang's
    ensure_mamba_capacity evicting the tree's state)."""
    pools = _pools(sg, kv_tokens=256, states=6, reserve=4, rows=8)
    cache = _backend(sg, pools)
    shared, kv = pools.shared, pools.token_to_kv_pool_allocator
    req_pool = pools.req_to_token_pool
    per_state = pools.layout.geometry.of(shared.state_type).per_large
    taken = []
    requests = []
    for rid in range(4):
        requests.append(_request(sg, cache, rid))
        taken.append(kv.alloc(kv.available_size()))  # KV grows into all it may
        held = rid + 1
        assert shared.held_by_requests() == held and shared.reserve_needed() == 4 - held
        # the un-netted reserve would still keep 4 states' pages closed beyond the held ones
        closed_before = -(-(4 + held) // per_state) - -(-held // per_state)
        assert shared.room(shared.state_type) >= 4 - held
        assert shared.pool.free_large_pages < closed_before or held == 4
    assert shared.pool.free_large_pages == 0 and kv.available_size() == 0  # KV took the rest
    # One request finishes and frees its state: the freed slot is the reserve's again.
    done = requests.pop(0)
    req_pool.free_mamba_cache(done)
    req_pool.free(done)
    assert kv.alloc(1) is None and shared.reserve_needed() == 1
    requests.append(_request(sg, cache, 4))
    # Another finishes by handing its state to the tree (KV slots from those KV took).
    done = requests.pop(0)
    tokens = list(done.origin_input_ids)
    value = taken[0][: len(tokens)]
    key = sg.RadixKey(array("q", tokens))
    state = done.kv.mamba_pool_idx.reshape(1).to(sg.torch.int64)
    result = cache.insert(sg.bpc.InsertParams(key=key, value=value, mamba_value=state))
    assert not result.mamba_exist
    done.kv.mamba_pool_idx = None  # the tree owns the slot now
    req_pool.free(done)
    assert shared.held_by_requests() == 3 and shared.room(shared.state_type) == 0
    requests.append(_request(sg, cache, 5))  # ensure_mamba_capacity evicts the tree's state
    assert cache.memory.held(cache.state_type) == 0 and shared.held_by_requests() == 4
    shared.check_integrity()
    cache.memory.check_integrity()


def test_configurator_hooks_pass_other_cases_through(sg: Any) -> None:
    """AROUND `_init_pools` calls SGLang's own unless --enable-jenga --jenga-pool serves a
    hybrid Mamba target worker with attention layers; AFTER `configure` changes only a result
    holding our allocator."""
    import msgspec
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigResult

    from jenga_sglang.binding.options import JENGA_ATTR, JengaOptions
    from jenga_sglang.binding.pools.hook import after_configure, around_init_pools

    calls = []

    def original(configurator: Any, **kwargs: Any) -> str:
        calls.append(kwargs)
        return "sglang's pools"

    for options, mambaish, swa in (
        (JengaOptions(enabled=True, pool=False), object(), False),
        (JengaOptions(enabled=True), None, False),
        (JengaOptions(), object(), False),
        # pure Mamba2: no attention layer, no KV to share a buffer with
        (JengaOptions(enabled=True), SimpleNamespace(full_attention_layer_ids=[]), False),
        # a sliding-window model with --no-jenga-pool, and one without --enable-jenga
        (JengaOptions(enabled=True, pool=False), None, True),
        (JengaOptions(), None, True),
    ):
        args = SimpleNamespace(**{JENGA_ATTR: options})
        configurator = SimpleNamespace(
            server_args=args, mambaish_config=mambaish, is_draft_worker=False, is_hybrid_swa=swa
        )
        got = around_init_pools(
            original,
            configurator,
            sizes=None,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=None,
        )
        assert got == "sglang's pools"
    assert len(calls) == 6

    pools = _pools(sg)
    fields = dict(
        max_total_num_tokens=7,
        max_running_requests=4,
        full_max_total_num_tokens=None,
        swa_max_total_num_tokens=None,
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool=pools.token_to_kv_pool,
        memory_pool_config=None,
    )
    ours = KVCacheConfigResult(
        token_to_kv_pool_allocator=pools.token_to_kv_pool_allocator, **fields
    )
    replaced = after_configure(ours, None)
    assert replaced.max_total_num_tokens == pools.token_to_kv_pool_allocator.size > 7
    other = msgspec.structs.replace(ours, token_to_kv_pool_allocator=object())
    assert after_configure(other, None) is None


def test_paged_kv_slots_fill_pages_and_read_through_sglang(sg: Any) -> None:
    """--page-size 4: an extend continues the request's partial page after its last slot and
    then takes whole pages of the pool; a decode step does the same; SGLang's paged KV reads
    and writes the same bytes as our token-major views; a free gives whole pages back."""
    from jenga_sglang.binding.pools.build import KV_TYPE

    torch = sg.torch
    pools = _pools(sg, kv_tokens=64, page_size=4)
    kv_pool, allocator, layout = (
        pools.token_to_kv_pool,
        pools.token_to_kv_pool_allocator,
        pools.layout,
    )
    assert allocator.page_size == kv_pool.page_size == 4
    free0 = allocator.available_size()
    one = torch.tensor([0])
    first = allocator.alloc_extend(
        one, one, torch.tensor([6]), torch.tensor([6]), torch.tensor([-1]), 6
    )
    assert first is not None and len(first) == 6
    pages = sorted({int(i) // 4 for i in first.tolist()})
    assert len(pages) == 2 and min(pages) >= 1  # two whole pages, never the sink page
    assert [int(i) % 4 for i in first.tolist()] == [0, 1, 2, 3, 0, 1]
    last = first[-1:].clone()
    more = allocator.alloc_extend(
        torch.tensor([6]), torch.tensor([6]), torch.tensor([11]), torch.tensor([11]), last, 5
    )
    assert more is not None
    assert more[:2].tolist() == [int(last) + 1, int(last) + 2]  # the partial page first
    assert int(more[2]) % 4 == 0  # then a fresh page
    step = allocator.alloc_decode(torch.tensor([12]), torch.tensor([12]), more[-1:])
    assert step is not None and int(step[0]) == int(more[-1]) + 1
    assert allocator.available_size() == free0 - 3 * 4
    k = torch.randn(12, 2, 8).bfloat16()
    loc = torch.cat([first, more, step])
    kv_pool.set_kv_buffer(_layer(2), loc, k, k)
    ours = layout.kv[KV_TYPE][1]
    assert torch.equal(ours.k_slots[loc], k)
    assert torch.equal(ours.k[int(loc[0]) // 4, 1], k[1])  # token-major 4-D view agrees
    allocator.free(loc)
    assert allocator.available_size() == free0
    pools.shared.check_integrity()


def test_a_paged_alloc_hands_out_whole_pages(sg: Any) -> None:
    """--page-size 4: `alloc` (a host load-back's KV) gives every slot of whole pages, as
    SGLang's paged allocator does, refuses a count that is not whole pages, and its slots go
    back page by page."""
    pools = _pools(sg, kv_tokens=64, page_size=4)
    allocator = pools.token_to_kv_pool_allocator
    free0 = allocator.available_size()
    got = allocator.alloc(8)
    assert got is not None and len(got) == 8
    pages = [int(i) // 4 for i in got.tolist()]
    assert pages[:4] == [pages[0]] * 4 and pages[4:] == [pages[4]] * 4 and pages[0] != pages[4]
    assert min(pages) >= 1 and [int(i) % 4 for i in got.tolist()] == [0, 1, 2, 3] * 2
    assert allocator.available_size() == free0 - 8
    with pytest.raises(ValueError, match="not whole pages of 4"):
        allocator.alloc(6)
    assert allocator.available_size() == free0 - 8  # the refusal took nothing
    assert allocator.alloc(free0) is None
    allocator.free(got)
    assert allocator.available_size() == free0
    pools.shared.check_integrity()


def _check(budget: Any, total: int) -> bool:
    """SGLang's admission question for a request of `total` tokens (no decode, no chunking)."""
    admit, _ = budget.check_prefill(
        extend_input_len=total,
        total_tokens=total,
        max_new_tokens=0,
        input_tokens=total,
        swa_host_hit_length=0,
        chunk_limit=None,
    )
    return bool(admit)


def test_admission_counts_the_kv_the_trees_evictable_states_would_free(
    sg: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """States fill the shared pool, a request's prefix is locked (PrefillAdder's pin while it
    decides) and the KV SGLang counts is short of the request: SGLang's own budget refuses it
    for good, nothing running to free KV (the hang binding/pools/budget.py fixes). Ours also
    counts the KV the tree's unlocked states would free, exactly what SGLang's allocation then
    gets by asking the tree to evict, and the locked prefix keeps its KV and state."""
    from sglang.srt.mem_cache.allocation import alloc_token_slots
    from sglang.srt.mem_cache.prefill_budget import PrefillBudget

    from jenga_sglang.binding.pools import budget

    pools = _pools(sg, kv_tokens=64, states=12, reserve=1)  # 11 large pages: 8 KV or 1 state
    cache = _backend(sg, pools)
    shared, kv = pools.shared, pools.token_to_kv_pool_allocator
    prefix = list(range(16))
    _insert(sg, cache, pools, prefix)
    entries = 0
    while kv.available_size() >= 8 and shared.room(shared.state_type) >= 2:
        _insert(sg, cache, pools, list(range(1000 * (entries + 1), 1000 * (entries + 1) + 8)))
        entries += 1
    assert entries >= 2
    key = sg.RadixKey(array("q", prefix))
    node = cache.match_prefix(sg.bpc.MatchPrefixParams(key=key)).last_device_node
    cache.inc_lock_ref(node)
    ours = kv.create_prefill_budget(cache)
    counted = kv.available_size() + cache.full_evictable_size()
    freed = ours.state_tokens()
    assert freed > 0 and cache.evictable_state_ids() and cache.mamba_protected_size() == 1
    reach = counted + freed
    assert not _check(PrefillBudget(kv, cache), counted)  # SGLang's count: at most counted - 1
    assert _check(ours, reach - 1)
    busy = kv.create_prefill_budget(cache)
    busy.total_offset = busy.current_offset = 1  # a running request's reservation
    assert not _check(busy, counted - 1)  # it will free KV: the head waits as SGLang's does
    monkeypatch.setattr(budget, "_last_stall_report", float("-inf"))
    with caplog.at_level(logging.WARNING, logger=budget.__name__):
        assert not _check(ours, reach)  # nothing runs to free more: said, with the figures
    assert f"a request of {reach} tokens waits: the Jenga pool can free {reach}" in caplog.text
    assert ours.has_capacity()
    slots = alloc_token_slots(cache, reach)  # SGLang's evict-then-alloc: every token counted
    assert slots is not None and len(slots) == reach
    assert kv.available_size() == 0  # and no more: the count was exact
    assert cache.match_prefix(sg.bpc.MatchPrefixParams(key=key)).device_prefix_len == 16
    assert not cache.evictable_state_ids() and cache.mamba_evictable_size() == 0
    shared.check_integrity()
    cache.memory.check_integrity()
    assert cache.memory.held(cache.kv_type) + reach == shared.allocated(shared.kv_type)
    cache.dec_lock_ref(node)


@pytest.mark.parametrize("eviction", ["jenga", "lru"])
def test_a_request_whose_locked_path_pins_the_pool_is_admitted_after_evicting(
    sg: Any, eviction: str
) -> None:
    """The path a request resumes from holds states at 8, 16, ..., 40 and, with its KV, fills
    the pool. While SGLang decides, that path is locked: nothing is evictable and nothing
    runs, so every pass would refuse it. The budget leaves the shortfall owed; the next
    match, the path unlocked, evicts that much, and within a few passes the request fits
    and SGLang's allocation gets its tokens. The server's policy drops the path's inner
    states and keeps the whole hit; LRU drops the path's tail too, a shorter hit."""
    from sglang.srt.mem_cache.allocation import alloc_token_slots

    pools = _pools(sg, kv_tokens=64, states=12, reserve=1)  # 11 large pages: 8 KV or 1 state
    cache = _backend(sg, pools, eviction)
    shared, kv = pools.shared, pools.token_to_kv_pool_allocator
    path = list(range(40))
    slots = kv.alloc(0)
    for end in range(8, 41, 8):  # one turn after another: a state at each 8 tokens
        slots = sg.torch.cat([slots, kv.alloc(8)])
        key = sg.RadixKey(array("q", path[:end]))
        state = pools.req_to_token_pool.mamba_allocator.alloc(1)
        cache.insert(sg.bpc.InsertParams(key=key, value=slots, mamba_value=state))
    assert cache.memory.held(cache.state_type) == 5 and kv.available_size() < 8
    request = sg.RadixKey(array("q", [*path, *range(500, 508)]))
    need = 8 + 1 + 8  # its new tokens, a page, 8 to decode
    passes = 0
    for _ in range(5):  # bounded: each pass evicts what the last one was short of
        passes += 1
        node = cache.match_prefix(sg.bpc.MatchPrefixParams(key=request)).last_device_node
        cache.inc_lock_ref(node)  # PrefillAdder's pin while it decides
        budget = kv.create_prefill_budget(cache)
        admitted = _check(budget, need + 40 - _node_end(node))
        if admitted:
            break
        assert cache.owed_kv > 0
        cache.dec_lock_ref(node)
    assert admitted and passes > 1 and cache.memory.held(cache.state_type) < 5
    assert _node_end(node) == 40 if eviction == "jenga" else _node_end(node) > 0
    got = alloc_token_slots(cache, need + 40 - _node_end(node))
    assert got is not None
    shared.check_integrity()
    cache.memory.check_integrity()
    cache.dec_lock_ref(node)


def _node_end(node: Any) -> int:
    return 0 if node.parent is None else int(node.end)


def test_admission_counts_less_evictable_kv_while_the_state_reserve_takes_pages_back(
    sg: Any,
) -> None:
    """Requests held the reserve's states, so KV took every other large page; then their
    states went into the tree, on paths running requests lock, and the reserve needs its
    pages again. Freeing KV now returns large pages the reserve takes: SGLang's count (free
    + evictable, one to one) admits what its allocation cannot get (the out-of-memory crash
    of the host tier's sessions load). Ours counts `kv_closing` less, and the allocation gets
    exactly what it counts."""
    from sglang.srt.mem_cache.allocation import alloc_token_slots
    from sglang.srt.mem_cache.prefill_budget import PrefillBudget

    pools = _pools(sg, kv_tokens=64, states=12, reserve=2)  # a large page: 8 KV or 1 state
    cache = _backend(sg, pools)
    shared, kv = pools.shared, pools.token_to_kv_pool_allocator
    held = [pools.req_to_token_pool.mamba_allocator.alloc(1) for _ in range(2)]
    assert shared.reserve_needed() == 0  # requests hold the whole reserve
    rows = []
    while kv.available_size() >= 8:
        rows.append(kv.alloc(8))
    locked = []
    for i, slots in enumerate(rows):  # two finish into the tree with their states
        key = sg.RadixKey(array("q", range(1000 * (i + 1), 1000 * (i + 1) + 8)))
        state = held[i] if i < 2 else None
        done = cache.insert(sg.bpc.InsertParams(key=key, value=slots, mamba_value=state))
        if state is not None:
            locked.append(done.last_device_node)
            cache.inc_lock_ref(done.last_device_node)  # running requests resume there
    closing = shared.kv_closing()
    assert shared.reserve_needed() == 2 and closing == 2 * 8
    assert not cache.evictable_state_ids()  # no state eviction can free gives pages back
    counted = kv.available_size() + cache.full_evictable_size()
    assert PrefillBudget(kv, cache).remaining_total == counted  # SGLang's count
    ours = kv.create_prefill_budget(cache)
    reach = counted - closing
    assert ours.remaining_total == reach
    assert _check(ours, reach - 1) and not _check(ours, reach)
    slots = alloc_token_slots(cache, reach)  # SGLang's evict-then-alloc gets every token
    assert slots is not None and len(slots) == reach
    assert kv.available_size() == 0 and cache.full_evictable_size() == 0  # and no more
    shared.check_integrity()
    cache.memory.check_integrity()
    for node in locked:
        cache.dec_lock_ref(node)


def test_one_question_walks_the_trees_states_once(sg: Any) -> None:
    """While the reserve is short, the budget's count frees the tree's evictable states in
    its head (`kv_closing`), and a retried question counts their KV as well: one walk of
    those states per question however often it reads the remaining tokens, and a fresh one
    for the next question (the tree may have changed in between)."""
    pools = _pools(sg, kv_tokens=64, states=12, reserve=2)  # a large page: 8 KV or 1 state
    cache = _backend(sg, pools)
    shared, kv = pools.shared, pools.token_to_kv_pool_allocator
    held = [pools.req_to_token_pool.mamba_allocator.alloc(1) for _ in range(2)]
    rows = []
    while kv.available_size() >= 8:
        rows.append(kv.alloc(8))
    for i, slots in enumerate(rows):
        key = sg.RadixKey(array("q", range(1000 * (i + 1), 1000 * (i + 1) + 8)))
        state = held[i] if i < 2 else None
        done = cache.insert(sg.bpc.InsertParams(key=key, value=slots, mamba_value=state))
        if i == 0:
            locked = done.last_device_node
            cache.inc_lock_ref(locked)  # one state locked, the other evictable
    assert shared.kv_closing() == 16 and len(cache.evictable_state_ids()) == 1
    walks = 0
    walk = cache.evictable_state_ids

    def counted() -> frozenset[int]:
        nonlocal walks
        walks += 1
        return walk()

    cache.evictable_state_ids = counted
    ours = kv.create_prefill_budget(cache)
    assert ours.has_capacity() and walks == 1  # remaining_total and remaining_current
    reach = ours.remaining_total + ours.state_tokens()  # outside a question: walked anew
    assert walks == 3
    assert _check(ours, reach - 1) and walks == 4
    del cache.evictable_state_ids
    cache.dec_lock_ref(locked)


def test_a_load_back_counts_the_room_its_checkpoint_takes(sg: Any) -> None:
    """SGLang prepares a load-back with the pass's budget (`prepare_load_back`: the host
    tokens, the extend, the decode headroom) and reserves no room for a checkpoint the load
    brings. Ours counts it (`fits_loaded_state`): on this pool a state takes a large page of
    8 KV tokens, and once the tree holds one more state exactly that much less is left."""
    pools = _pools(sg, kv_tokens=64, states=12, reserve=1)  # 11 large pages: 8 KV or 1 state
    cache = _backend(sg, pools)
    shared, kv = pools.shared, pools.token_to_kv_pool_allocator
    _insert(sg, cache, pools, list(range(16)))
    ours = kv.create_prefill_budget(cache)
    assert cache.admission_budget is ours
    cost = shared.kv_cost_of_state()
    left = int(ours.remaining_total)
    assert cost == 8 and left > cost

    def prepared(tokens: int) -> bool:
        assert ours.prepare_load_back(
            full_tokens=tokens, extend_input_len=tokens, max_new_tokens=0,
            swa_host_hit_length=0, chunk_limit=None,
        )  # fmt: skip
        return bool(ours.fits_loaded_state())

    assert prepared(left - cost) and not prepared(left - cost + 1)
    _insert(sg, cache, pools, list(range(100, 101)))  # one more state in the tree (its KV
    assert int(ours.remaining_total) == left - cost  # stays evictable: counted as before)
