"""Torch views of the Jenga pool: uniform strides, no copies, isolation between page types."""

from __future__ import annotations

import pytest
import torch

from jenga_sglang.models.spec import (
    AttentionGroup,
    DType,
    MambaGroup,
    MlpGroup,
    ModelSpec,
)
from jenga_sglang.pool.layout import PoolLayout, build_layout
from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.pool.sizing import geometry_for_spec
from jenga_sglang.radix.pages import PageKind, PageType

SPEC = ModelSpec(
    "tiny-hybrid",
    (
        AttentionGroup("full", 2, 2, 8, DType.BF16, 1.0, 1.0),  # 128 B per token
        MlpGroup("mlp", 2, 1.0),
        MambaGroup("ssm", 3, (6, 3), DType.BF16, (2, 4, 5), DType.FP32, 1.0),  # 36 B + 160 B
        AttentionGroup("swa", 1, 1, 16, DType.FP32, 1.0, 1.0, window=4),  # 128 B per token
    ),
    hidden_size=16,
)
KV_FULL, STATE, KV_SWA = (
    PageType(PageKind.KV, 0),
    PageType(PageKind.STATE, 2),
    PageType(PageKind.KV, 3),
)


def _pool_and_layout(tokens_per_page: int) -> tuple[JengaPool, PoolLayout]:
    geo = geometry_for_spec(SPEC, tokens_per_page=tokens_per_page, alignment=64)
    pool = JengaPool(geo, 8 * geo.large_page_bytes)
    return pool, build_layout(geo, SPEC, pool.num_large)


def _all_views(layout: PoolLayout, ptype: PageType) -> list[torch.Tensor]:
    if ptype in layout.kv:
        return [v for layer in layout.kv[ptype] for v in (layer.k, layer.v)]
    st = layout.state[ptype]
    return [*st.conv, *st.temporal]


@pytest.mark.parametrize("tokens_per_page", [1, 3])
def test_shapes_strides_and_no_copies(tokens_per_page: int) -> None:
    pool, layout = _pool_and_layout(tokens_per_page)
    geo = layout.geometry
    assert layout.buffer.numel() == pool.num_large * geo.large_page_bytes
    base = layout.buffer.data_ptr()
    for ptype in geo.page_types:
        tg = geo.of(ptype)
        for view in _all_views(layout, ptype):
            assert view.shape[0] == pool.num_pages(ptype)
            assert view.stride(0) * view.element_size() == tg.page_bytes  # uniform page stride
            assert view.untyped_storage().data_ptr() == base  # a view, not a copy
    full = layout.kv[KV_FULL][1]
    assert tuple(full.k.shape) == (pool.num_pages(KV_FULL), tokens_per_page, 2, 8)
    assert full.k.dtype == torch.bfloat16
    st = layout.state[STATE]
    assert tuple(st.conv[0].shape[1:]) == (6, 3) and st.conv[0].dtype == torch.bfloat16
    assert tuple(st.temporal[2].shape[1:]) == (2, 4, 5) and st.temporal[2].dtype == torch.float32
    assert tuple(st.temporal_stacked.shape) == (3, pool.num_pages(STATE), 2, 4, 5)
    assert torch.equal(st.temporal_stacked[1], st.temporal[1])
    for view in [*st.conv, *st.temporal]:  # every state tensor starts on the alignment
        assert (view.data_ptr() - base) % 64 == 0


def _all_ones_bytes(dtype: torch.dtype) -> torch.Tensor:
    """A scalar of `dtype` whose every byte is 0x01 (so written bytes are all non-zero)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[dtype.itemsize]
    pattern = int.from_bytes(b"\x01" * dtype.itemsize, "little")
    return torch.tensor([pattern], dtype=ints).view(dtype)[0]


def test_views_of_one_page_tile_it_without_overlap() -> None:
    pool, layout = _pool_and_layout(2)
    for ptype in layout.geometry.page_types:
        page = pool.num_pages(ptype) - 1
        seen = torch.zeros(layout.geometry.of(ptype).page_bytes, dtype=torch.int32)
        for view in _all_views(layout, ptype):
            layout.buffer.zero_()
            view[page] = _all_ones_bytes(view.dtype)
            touched = layout.page_bytes(ptype, page) != 0
            assert int(layout.buffer.count_nonzero()) == int(touched.sum())  # only this page
            assert int(touched.sum()) == view[page].numel() * view.element_size()
            seen += touched.to(torch.int32)
        assert int(seen.max()) == 1  # no byte written by two views
        assert int(seen.sum()) == layout.geometry.of(ptype).data_bytes  # every payload byte


def test_slot_views_need_one_token_per_page() -> None:
    _, layout1 = _pool_and_layout(1)
    k = layout1.kv[KV_SWA][0]
    assert tuple(k.k_slots.shape) == (k.k.shape[0], 1, 16)
    assert k.k_slots.data_ptr() == k.k.data_ptr()
    _, layout3 = _pool_and_layout(3)
    with pytest.raises(ValueError, match="tokens_per_page == 1"):
        _ = layout3.kv[KV_SWA][0].k_slots


def test_writes_through_one_type_leave_other_types_live_pages_intact() -> None:
    gen = torch.Generator().manual_seed(0)
    pool, layout = _pool_and_layout(2)
    live = {
        KV_FULL: pool.alloc(KV_FULL, 5, owner=1).ids(),
        STATE: pool.alloc(STATE, 2, owner=1).ids(),
        KV_SWA: pool.alloc(KV_SWA, 4, owner=2).ids() + pool.alloc(KV_SWA, 3, owner=1).ids(),
    }
    layout.buffer.copy_(
        torch.randint(0, 256, layout.buffer.shape, dtype=torch.uint8, generator=gen)
    )
    for writer in live:
        before = {t: [layout.page_bytes(t, p).clone() for p in ids] for t, ids in live.items()}
        index = torch.tensor(live[writer])
        for view in _all_views(layout, writer):
            data = torch.randn((len(index), *view.shape[1:]), generator=gen).to(view.dtype)
            view[index] = data
            assert torch.equal(view[index], data)
        for t, ids in live.items():
            for page, old in zip(ids, before[t], strict=True):
                changed = not torch.equal(layout.page_bytes(t, page), old)
                assert changed == (t == writer), f"{t} page {page} changed={changed}"
