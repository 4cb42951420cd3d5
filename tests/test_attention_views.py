"""SGLang's Triton attention kernels read the Jenga pool's KV views right (Triton interpreter).

Per layer, a K/V slot of the Jenga pool is a row of a strided view whose row stride is a whole
KV page (page size 1) or one token of every layer (token-major pages, page size > 1), not the
row's own `kv_heads x head_dim` (pool/layout.py). SGLang's Triton backend hands
`get_key_buffer(layer_id)` / `get_value_buffer(layer_id)` of its KV pool straight to its extend,
deterministic-extend and decode kernels (tests/attention_views.py calls them as the backend
does).

Here the pools are the ones the server builds (binding/pools/build.py: the Mamba-hybrid pool, and
the sliding-window pool of a gpt-oss-like model with its window lists, window size and attention
sinks), at pages of 1, 16 and 64 tokens. Each kernel's output on the pool's views must equal its
output on contiguous copies of the same values bit for bit, and be close to a float64 reference
(so neither run reads nothing); a view with the contiguous row stride over the same bytes must
give other outputs, which is what a kernel ignoring the row stride would read.
scripts/gpu_attention_views.py runs the same checks compiled on a GPU.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import triton_cpu  # noqa: F401  # the interpreter patches, before SGLang's kernels import triton
from attention_views import (
    HKV,
    HQ,
    PAGES,
    SWS,
    D,
    Layer,
    assert_misread_caught,
    assert_pool_strides,
    assert_read_right,
    engine_pages,
    fill,
    load_kernels,
)

pytestmark = [
    pytest.mark.exactness,
    pytest.mark.sglang,
    # Masked-out lanes (empty KV splits, query rows past a request's end) compute -inf - -inf
    # and exp(sink + inf) under the interpreter and are never stored; numpy warns, CUDA does not.
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
]

FLOAT = torch.float32  # the interpreter computes bfloat16 dot products on the raw bits


@pytest.fixture(scope="module")
def sg() -> SimpleNamespace:
    from sglang.test.unified_allocator_fixtures import setup_allocator_context

    setup_allocator_context()
    return load_kernels()


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr(), a.shape, a.stride()) == (b.data_ptr(), b.shape, b.stride())


def _mamba_hybrid_layer(page: int, gen: torch.Generator) -> Layer:
    """The last full-attention layer of a Mamba hybrid's pool (layers 0, 2 Mamba, 1, 3
    attention), as binding/pools/hook.py builds it; its buffers are the layout's slot views."""
    from jenga_sglang.binding.pools.build import (
        KV_TYPE,
        KVShape,
        build_jenga_pools,
        static_split_bytes,
        storage_spec,
    )

    kv = KVShape((1, 3), head_num=HKV, head_dim=D, dtype=FLOAT)
    params = SimpleNamespace(
        shape=SimpleNamespace(conv=[(3, 8)], temporal=(1, 4, 8)),
        dtype=SimpleNamespace(conv=FLOAT, temporal=FLOAT),
        layers=[0, 2],
    )
    pools = build_jenga_pools(
        kv=kv,
        cache_params=params,
        mamba_layer_ids=(0, 2),
        budget_bytes=static_split_bytes(storage_spec(kv, params), 1024, 4),
        state_reserve=1,
        device="cpu",
        req_pool_kwargs={
            "size": 4,
            "mamba_spec_state_size": 4,
            "max_context_len": 256,
            "enable_mamba_extra_buffer": False,
        },
        page_size=page,
    )
    fill(pools.layout, gen)
    k, v = pools.token_to_kv_pool.get_kv_buffer(3)
    ours = pools.layout.kv[KV_TYPE][1]
    assert _same_view(k, ours.k_slots) and _same_view(v, ours.v_slots)
    per_large = pools.layout.geometry.of(KV_TYPE).per_large
    pages = engine_pages(k.shape[0], page, range(pools.layout.num_large), per_large)
    return Layer(k, v, page, pages)


def _swa_layers(page: int, gen: torch.Generator) -> tuple[Layer, Layer]:
    """The last window layer and the last full layer of a gpt-oss-like pool (layers 0, 2
    sliding window, 1, 3 full, sinks on every layer), as binding/pools/swa_hook.py builds it.
    Full and window pages come from different large pages, as the pool carves them."""
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    from jenga_sglang.binding.pools.build import (
        FULL_TYPE,
        WINDOW_TYPE,
        KVShape,
        build_jenga_swa_pools,
        swa_storage_spec,
    )

    full, window = KVShape((1, 3), HKV, D, FLOAT), KVShape((0, 2), HKV, D, FLOAT)
    token_bytes = [g.kv_bytes_per_token for g in swa_storage_spec(full, window).attention_groups]
    pools = build_jenga_swa_pools(
        full=full,
        window=window,
        budget_bytes=1024 * sum(token_bytes),
        device="cpu",
        req_to_token_pool=ReqToTokenPool(
            size=4, max_context_len=256, device="cpu", enable_memory_saver=False
        ),
        page_size=page,
    )
    fill(pools.layout, gen)
    layout = pools.layout

    def layer(layer_id: int, ptype: Any, parity: int, window_size: int) -> Layer:
        k, v = pools.token_to_kv_pool.get_kv_buffer(layer_id)
        ours = layout.kv[ptype][1]
        assert _same_view(k, ours.k_slots) and _same_view(v, ours.v_slots)
        large = range(parity, layout.num_large, 2)
        pages = engine_pages(k.shape[0], page, large, layout.geometry.of(ptype).per_large)
        sinks = torch.randn(HQ, generator=gen, dtype=FLOAT)
        return Layer(k, v, page, pages, window_size, sinks)

    return layer(2, WINDOW_TYPE, 0, SWS), layer(3, FULL_TYPE, 1, -1)


@pytest.mark.parametrize("page", PAGES)
def test_triton_kernels_read_the_mamba_hybrid_pool_views_bit_for_bit(
    sg: SimpleNamespace, page: int
) -> None:
    gen = torch.Generator().manual_seed(page)
    layer = _mamba_hybrid_layer(page, gen)
    assert_pool_strides(layer, layers_in_group=2)
    assert_read_right(sg, layer, gen)


@pytest.mark.parametrize("page", PAGES)
def test_triton_kernels_read_the_sliding_window_pool_views_bit_for_bit(
    sg: SimpleNamespace, page: int
) -> None:
    """gpt-oss's layers: a window layer reads its window list (last SWS positions) with the
    window mask, a full layer everything; both with attention sinks."""
    gen = torch.Generator().manual_seed(100 + page)
    for layer in _swa_layers(page, gen):
        assert_pool_strides(layer, layers_in_group=2)
        assert_read_right(sg, layer, gen)


@pytest.mark.parametrize("page", PAGES)
def test_a_kernel_ignoring_the_row_stride_would_be_caught(sg: SimpleNamespace, page: int) -> None:
    gen = torch.Generator().manual_seed(200 + page)
    window, _ = _swa_layers(page, gen)
    for layer in (_mamba_hybrid_layer(page, gen), window):
        assert_misread_caught(sg, layer, gen)
