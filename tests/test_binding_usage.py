"""SGLang's usage figures over the Jenga pool (binding/pools/usage.py).

SGLang's own `SchedulerPoolStatsObserver._get_mamba_token_info` runs on our real pool objects
(built as in test_sglang_jenga_pool.py) and a stub tree; our AFTER hook must turn its Mamba figure
into requests' states over what states can hold now, and leave KV's and the leak check's fields.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.sglang

ATTN = (0, 2)
MAMBA = (1, 3)


@pytest.fixture(scope="module")
def torch_mod() -> Any:
    import torch
    from sglang.test.unified_allocator_fixtures import setup_allocator_context

    setup_allocator_context()
    return torch


def _pools(torch: Any) -> Any:
    from jenga_sglang.binding.pools.build import (
        KVShape,
        build_jenga_pools,
        static_split_bytes,
        storage_spec,
    )

    kv = KVShape(ATTN, head_num=2, head_dim=8, dtype=torch.bfloat16)
    params = SimpleNamespace(
        shape=SimpleNamespace(conv=[(3, 8)], temporal=(1, 4, 8)),
        dtype=SimpleNamespace(conv=torch.bfloat16, temporal=torch.float32),
        layers=list(MAMBA),
    )
    return build_jenga_pools(
        kv=kv,
        cache_params=params,
        mamba_layer_ids=MAMBA,
        budget_bytes=static_split_bytes(storage_spec(kv, params), 256, 16),
        state_reserve=2,
        device="cpu",
        req_pool_kwargs={
            "size": 4,
            "mamba_spec_state_size": 4,
            "max_context_len": 128,
            "enable_mamba_extra_buffer": False,
        },
    )


def _observer(pools: Any, kv_evictable: int = 0, states_evictable: int = 0) -> Any:
    tree = SimpleNamespace(
        supports_mamba=lambda: True,
        supports_prefix_sharing=lambda: True,
        full_evictable_size=lambda: kv_evictable,
        mamba_evictable_size=lambda: states_evictable,
    )
    return SimpleNamespace(
        tree_cache=tree,
        token_to_kv_pool_allocator=pools.token_to_kv_pool_allocator,
        req_to_token_pool=pools.req_to_token_pool,
    )


def _stats(pools: Any, **evictable: int) -> tuple[Any, Any]:
    """SGLang's figures, then ours (the hook applied to SGLang's)."""
    from sglang.srt.managers.scheduler_components.pool_stats_observer import (
        SchedulerPoolStatsObserver,
    )

    from jenga_sglang.binding.pools.usage import after_mamba_token_info

    observer = _observer(pools, **evictable)
    stock = SchedulerPoolStatsObserver._get_mamba_token_info(observer)
    ours = after_mamba_token_info(stock, observer)
    assert ours is not None
    return stock, ours


def test_usage_is_over_what_each_type_can_hold_now(torch_mod: Any) -> None:
    pools = _pools(torch_mod)
    shared, kv_alloc = pools.shared, pools.token_to_kv_pool_allocator
    mamba_alloc = pools.req_to_token_pool.mamba_allocator
    states = mamba_alloc.alloc(2)
    assert states is not None
    tokens = kv_alloc.alloc(24)
    assert tokens is not None
    stock, ours = _stats(pools)
    kv_room, state_room = shared.room(shared.kv_type), shared.room(shared.state_type)
    # KV: SGLang's own figure is already over what KV can hold now.
    assert ours.full_num_used == 24
    assert ours.full_token_usage == pytest.approx(24 / (24 + kv_room))
    # Mamba: SGLang divides by every page as a state; we divide by what states can hold now.
    assert stock.mamba_usage == pytest.approx(2 / mamba_alloc.size)
    assert ours.mamba_usage == pytest.approx(2 / (2 + state_room))
    assert ours.mamba_usage > stock.mamba_usage
    # The leak check's fields keep SGLang's conservation view.
    assert ours.mamba_available_size == mamba_alloc.size - 2
    assert ours.mamba_num_used == stock.mamba_num_used == 2

    # KV taking more pages leaves fewer states room: the Mamba figure rises with it.
    more = kv_alloc.alloc(kv_alloc.available_size() // 2)
    assert more is not None
    _, fuller = _stats(pools)
    assert fuller.mamba_usage > ours.mamba_usage
    assert fuller.full_token_usage > ours.full_token_usage

    # What the tree could evict is not usage, as in SGLang.
    _, cached = _stats(pools, kv_evictable=24, states_evictable=1)
    assert cached.mamba_num_used == 1
    assert cached.mamba_usage == pytest.approx(1 / (2 + shared.room(shared.state_type)))

    mamba_alloc.free(states)
    kv_alloc.free(tokens)
    kv_alloc.free(more)
    _, idle = _stats(pools)
    assert idle.mamba_usage == 0.0 and idle.full_token_usage == 0.0


def test_stock_pools_keep_sglangs_figure() -> None:
    from jenga_sglang.binding.pools.usage import after_mamba_token_info

    observer = SimpleNamespace(req_to_token_pool=SimpleNamespace(mamba_allocator=object()))
    assert after_mamba_token_info(SimpleNamespace(mamba_num_used=3), observer) is None
