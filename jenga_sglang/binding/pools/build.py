"""Build the Jenga pool and SGLang's pool objects over it, from what SGLang resolved.

The page sizes come from SGLang's own tensors (KV heads, head dim and dtype of the full-attention
pool; conv / temporal shapes and dtypes of `Mamba2CacheParams`), not from our model spec, so the
views have exactly the shapes SGLang's kernels index. The byte budget is what the static split
would have allocated for the same model and memory (`static_split_bytes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from jenga_sglang.binding.pools.allocator import JengaKVAllocator, JengaMambaAllocator
from jenga_sglang.binding.pools.sglang_pool import (
    DraftKV,
    JengaHybridLinearKVPool,
    JengaHybridReqToTokenPool,
    JengaMambaPool,
    JengaMambaRows,
    JengaMHATokenToKVPool,
)
from jenga_sglang.binding.pools.swa_allocator import JengaSWAAllocator
from jenga_sglang.binding.pools.transfer import TransferEntry
from jenga_sglang.models.spec import AttentionGroup, DType, MambaGroup, ModelSpec
from jenga_sglang.pool.layout import PoolLayout, build_layout, sink_size
from jenga_sglang.pool.paired import PairedJengaPool
from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.pool.shared import SharedJengaPool
from jenga_sglang.pool.sizing import PoolGeometry, geometry_for_spec
from jenga_sglang.radix.pages import PageKind, PageType

KV_TYPE = PageType(PageKind.KV, 0)
STATE_TYPE = PageType(PageKind.STATE, 1)


class PoolBuildError(NotImplementedError):
    """The model or configuration has storage the Jenga pool cannot hold (named in the text)."""


@dataclass(frozen=True)
class KVShape:
    """SGLang's full-attention KV pool: heads, head dim and dtype of its layers, and the KV
    layers of a draft model of the same shape kept in the same rows (binding/pools/draft.py)."""

    layer_ids: tuple[int, ...]
    head_num: int
    head_dim: int
    dtype: torch.dtype
    draft_layers: int = 0

    @property
    def stored_layers(self) -> int:
        return len(self.layer_ids) + self.draft_layers


@dataclass(frozen=True)
class JengaPools:
    """Everything `_init_pools` returns, plus our pool and layout for inspection."""

    req_to_token_pool: JengaMambaRows  # a PD decode side's: binding/pools/decode_pool.py
    token_to_kv_pool: JengaHybridLinearKVPool  # SGLang's hybrid pool around our KV pool
    token_to_kv_pool_allocator: JengaKVAllocator
    shared: SharedJengaPool
    layout: PoolLayout


def _dtype(torch_dtype: torch.dtype) -> DType:
    name = str(torch_dtype).removeprefix("torch.")
    for candidate in DType:
        if candidate.torch_name == name:
            return candidate
    raise PoolBuildError(f"the Jenga pool holds no {torch_dtype} tensors (FP8 KV is stored raw)")


def storage_spec(kv: KVShape, cache_params: Any) -> ModelSpec:
    """A spec of what the pool stores: group 0 the KV layers, group 1 the Mamba states."""
    convs = list(cache_params.shape.conv)
    if len(convs) != 1:
        raise PoolBuildError(f"the Jenga pool holds one conv state per layer, got {convs}")
    attention = AttentionGroup(
        "kv", kv.stored_layers, kv.head_num, kv.head_dim, _dtype(kv.dtype), 1.0, 1.0
    )
    mamba = MambaGroup(
        "mamba",
        len(cache_params.layers),
        tuple(convs[0]),
        _dtype(cache_params.dtype.conv),
        tuple(cache_params.shape.temporal),
        _dtype(cache_params.dtype.temporal),
        1.0,
    )
    return ModelSpec("jenga-pool-storage", (attention, mamba), hidden_size=1)


def static_split_bytes(spec: ModelSpec, kv_tokens: int, mamba_states: int) -> int:
    """Bytes of SGLang's static split: KV rows (tokens + sink) and state rows (states + sink)."""
    return (kv_tokens + 1) * spec.kv_bytes_per_token + (mamba_states + 1) * spec.state_bytes


def paged_layout(
    spec: ModelSpec, budget_bytes: int, page_size: int, device: str
) -> tuple[PoolGeometry, int, PoolLayout]:
    """Geometry (a KV page holds `page_size` tokens, SGLang's --page-size), large pages of the
    budget, and the buffer's views. Above one token a KV page is ordered by token, which lets a
    layer's token slots be one strided view only if the page is not padded (pool/layout.py)."""
    geometry = geometry_for_spec(spec, tokens_per_page=page_size)
    for tg in geometry.types:
        group = spec.groups[tg.ptype.group]
        token = group.kv_bytes_per_token if isinstance(group, AttentionGroup) else 0
        if page_size > 1 and token and tg.page_bytes != page_size * token:
            raise PoolBuildError(
                f"--page-size {page_size}: KV pages of {page_size} x {token} B are padded to "
                f"{tg.page_bytes} B in this pool (pass --no-jenga-pool)"
            )
    num_large = large_pages_for(geometry, budget_bytes)
    layout = build_layout(
        geometry, spec, num_large, device=device, sink=True, token_major=page_size > 1
    )
    return geometry, num_large, layout


def large_pages_for(geometry: PoolGeometry, budget_bytes: int) -> int:
    """Large pages that fit in `budget_bytes` after the sink."""
    num_large = (budget_bytes - sink_size(geometry)) // geometry.large_page_bytes
    if num_large < 2:
        raise PoolBuildError(
            f"a budget of {budget_bytes} bytes holds {num_large} large pages of "
            f"{geometry.large_page_bytes} bytes; the Jenga pool needs at least 2"
        )
    return int(num_large)


def build_jenga_pools(
    *,
    kv: KVShape,
    cache_params: Any,
    mamba_layer_ids: Sequence[int],
    budget_bytes: int,
    state_reserve: int,
    device: str,
    req_pool_kwargs: dict[str, Any],
    page_size: int = 1,
    checkpoint_base: int = 0,
    req_pool_class: type[JengaMambaRows] = JengaHybridReqToTokenPool,
) -> JengaPools:
    """One buffer of `budget_bytes`, SGLang's pool objects over its views, our allocators
    (`req_pool_class`: the request pool, a PD decode side's has rows for pre-allocation)."""
    spec = storage_spec(kv, cache_params)
    geometry, num_large, layout = paged_layout(spec, budget_bytes, page_size, device)
    pool = JengaPool(geometry, num_large * geometry.large_page_bytes)
    shared = SharedJengaPool(pool, KV_TYPE, STATE_TYPE, state_reserve)
    layers = layout.kv[KV_TYPE][: len(kv.layer_ids)]
    kv_pool = JengaMHATokenToKVPool(
        k_views=[views.k_slots for views in layers],
        v_views=[views.v_slots for views in layers],
        dtype=kv.dtype,
        device=device,
        page_size=page_size,
        transfer=TransferEntry.of(layout, KV_TYPE),
    )
    mamba_pool = JengaMambaPool(
        views=layout.state[STATE_TYPE],
        mamba_layer_ids=mamba_layer_ids,
        device=device,
        transfer=TransferEntry.of(layout, STATE_TYPE),
    )
    req_pool = req_pool_class(
        mamba_pool=mamba_pool,
        mamba_allocator=JengaMambaAllocator(shared, device),
        checkpoint_base=checkpoint_base,  # int8 checkpoints: stock's Mamba pool size
        cache_params=cache_params,
        mamba_layer_ids=list(mamba_layer_ids),
        device=device,
        enable_memory_saver=False,
        **req_pool_kwargs,
    )
    hybrid = JengaHybridLinearKVPool(
        size=kv_pool.size,
        dtype=kv.dtype,
        page_size=page_size,
        head_num=kv.head_num,
        head_dim=kv.head_dim,
        full_attention_layer_ids=list(kv.layer_ids),
        device=device,
        mamba_pool=mamba_pool,
        full_kv_pool=kv_pool,
    )
    if kv.draft_layers:  # what the draft worker's pool views (binding/pools/draft.py)
        drafts = layout.kv[KV_TYPE][len(kv.layer_ids) :]
        hybrid.jenga_draft_kv = DraftKV(
            [v.k_slots for v in drafts], [v.v_slots for v in drafts], kv.dtype, page_size
        )
    allocator = JengaKVAllocator(shared, hybrid, kv.dtype, device, page_size)
    return JengaPools(req_pool, hybrid, allocator, shared, layout)


FULL_TYPE = PageType(PageKind.KV, 0)
WINDOW_TYPE = PageType(PageKind.KV, 1)


@dataclass(frozen=True)
class JengaSWAPools:
    """`_init_pools`'s three objects for a hybrid-SWA model, plus our pool and layout."""

    req_to_token_pool: Any  # SGLang's own ReqToTokenPool
    token_to_kv_pool: Any  # SGLang's SWAKVPool around our two KV pools
    token_to_kv_pool_allocator: JengaSWAAllocator
    paired: PairedJengaPool
    layout: PoolLayout


def swa_storage_spec(full: KVShape, window: KVShape) -> ModelSpec:
    """What the pool stores for a hybrid-SWA model: group 0 full KV, group 1 window KV."""
    groups = tuple(
        AttentionGroup(
            name, len(kv.layer_ids), kv.head_num, kv.head_dim, _dtype(kv.dtype), 1.0, 1.0
        )
        for name, kv in (("full", full), ("window", window))
    )
    return ModelSpec("jenga-pool-swa-storage", groups, hidden_size=1)


def build_jenga_swa_pools(
    *,
    full: KVShape,
    window: KVShape,
    budget_bytes: int,
    device: str,
    req_to_token_pool: Any,
    page_size: int = 1,
) -> JengaSWAPools:
    """One buffer of `budget_bytes` carved into full and window KV pages on demand, SGLang's
    SWAKVPool over its views and SGLang's SWA allocator over our pool (request rows are
    SGLang's own `req_to_token_pool`)."""
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    spec = swa_storage_spec(full, window)
    geometry, num_large, layout = paged_layout(spec, budget_bytes, page_size, device)
    paired = PairedJengaPool(
        JengaPool(geometry, num_large * geometry.large_page_bytes), FULL_TYPE, WINDOW_TYPE
    )
    pools = {
        ptype: JengaMHATokenToKVPool(
            k_views=[views.k_slots for views in layout.kv[ptype]],
            v_views=[views.v_slots for views in layout.kv[ptype]],
            dtype=kv.dtype,
            device=device,
            page_size=page_size,
        )
        for ptype, kv in ((FULL_TYPE, full), (WINDOW_TYPE, window))
    }
    kv_pool = SWAKVPool(
        size=pools[FULL_TYPE].size,
        size_swa=pools[WINDOW_TYPE].size,
        page_size=page_size,
        dtype=full.dtype,
        head_num=full.head_num,
        head_dim=full.head_dim,
        swa_attention_layer_ids=list(window.layer_ids),
        full_attention_layer_ids=list(full.layer_ids),
        device=device,
        # SWAKVPool builds its two halves from these classes: ours are built already.
        full_kv_pool_class=lambda **_: pools[FULL_TYPE],
        swa_kv_pool_class=lambda **_: pools[WINDOW_TYPE],
    )
    allocator = JengaSWAAllocator(paired, kv_pool, full.dtype, device, page_size)
    return JengaSWAPools(req_to_token_pool, kv_pool, allocator, paired, layout)
