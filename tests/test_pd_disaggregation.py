"""Prefill-decode disaggregation over the Jenga pool (binding/pools/transfer.py): what SGLang's
transfer engines register for the pool, as SGLang's own PD set-up reads it.

A transfer engine moves row i of a registered buffer as [pointer + i x item, + item). The pool
registers one region per page type, a whole small page per row: every row must be exactly
the page the views call by that number, holding every layer's K and V (or conv and temporal
state), so that a page-for-page copy between two peers moves every layer and nothing else.
Entries pair by layer id; a peer on SGLang's per-layer buffers or on a pool of another geometry
must not pair with ours. The end-to-end run over SGLang's Mooncake backend (bytes over loopback
TCP) is tests/test_e2e_pd.py.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import pytest
from test_sglang_jenga_pool import ATTN, MAMBA, _pools, sg  # noqa: F401  # sg: fixture

pytestmark = pytest.mark.sglang


def _build(sg: Any, *, page_size: int = 1, kv_tokens: int = 64, **shape: Any) -> Any:  # noqa: F811
    """The shared test pools (`_pools`), `kv_tokens` pages of KV in the budget."""
    return _pools(sg, kv_tokens=kv_tokens * page_size, page_size=page_size, **shape)


def _kv_args(pools: Any) -> Any:
    """SGLang's own PD registration of a pool set, as its prefill and decode workers build it."""
    from sglang.srt.disaggregation.utils import (
        build_kv_layer_ids,
        get_kv_transfer_buf_infos,
        setup_state_kv_args,
    )

    hybrid = pools.token_to_kv_pool
    args = SimpleNamespace()
    args.kv_data_ptrs, args.kv_data_lens, args.kv_item_lens = get_kv_transfer_buf_infos(hybrid)
    args.kv_layer_ids = build_kv_layer_ids(
        token_to_kv_pool=hybrid,
        draft_token_to_kv_pool=None,
        num_draft_entries=0,
        num_hidden_layers=4,
    )
    setup_state_kv_args(args, hybrid, None, 4, req_to_token_pool=pools.req_to_token_pool)
    return args


def _page_rows(pools: Any, page_size: int) -> tuple[list[Any], list[Any]]:
    """Per page row: the KV views' tensors of that SGLang page, the state views' of that slot."""
    kv = pools.token_to_kv_pool.full_kv_pool
    mamba = pools.req_to_token_pool.mamba_pool.mamba_cache
    pages = kv.k_buffer[0].shape[0] // page_size
    kv_rows = [
        [b[p * page_size : (p + 1) * page_size] for b in kv.k_buffer + kv.v_buffer]
        for p in range(pages)
    ]
    slots = mamba.temporal.shape[1]
    state_rows = [[mamba.conv[0][:, s], mamba.temporal[:, s]] for s in range(slots)]
    return kv_rows, state_rows


def _within(tensors: list[Any], start: int, item: int) -> bool:
    return all(
        start <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= start + item
        if t.is_contiguous()
        else all(start <= r.data_ptr() < start + item for r in t.unbind(0))
        for t in tensors
    )


@pytest.mark.parametrize("page_size", [1, 4])
def test_each_registered_row_is_the_views_page_and_nothing_else(sg: Any, page_size: int) -> None:  # noqa: F811
    pools = _build(sg, page_size=page_size)
    args = _kv_args(pools)
    buffer = pools.layout.buffer
    end = buffer.data_ptr() + buffer.numel()
    assert len(args.kv_data_ptrs) == len(args.state_data_ptrs[0]) == 1  # one region per type
    kv_rows, state_rows = _page_rows(pools, page_size)
    for ptrs, lens, items, rows in (
        (args.kv_data_ptrs, args.kv_data_lens, args.kv_item_lens, kv_rows),
        (args.state_data_ptrs[0], args.state_data_lens[0], args.state_item_lens[0], state_rows),
    ):
        (ptr,), (length,), (item,) = ptrs, lens, items
        assert length == len(rows) * item and buffer.data_ptr() <= ptr and ptr + length <= end
        for r in (1, 2, len(rows) // 2, len(rows) - 1):  # row 0 is SGLang's padding sink
            assert _within(rows[r], ptr + r * item, item)  # every layer of page r, inside it
            assert not _within(rows[r], ptr + (r - 1) * item, item)
    assert args.kv_layer_ids == pools.token_to_kv_pool.get_kv_layer_ids()
    assert args.state_types and args.state_dim_per_tensor == [[]]  # whole pages: no reslicing


def _allocate(pools: Any, kv: int, states: int) -> tuple[list[int], list[int]]:
    """Rows the allocators hand out (pages of one buffer: KV and state rows never overlap)."""
    slots = pools.token_to_kv_pool_allocator.alloc(kv)
    held = pools.req_to_token_pool.mamba_allocator.alloc(states)
    assert slots is not None and held is not None
    return slots.tolist(), held.tolist()


def test_a_page_copy_moves_every_layer_of_it_to_the_peers_page(sg: Any) -> None:  # noqa: F811
    torch = sg.torch
    prefill, decode = _build(sg), _build(sg, decode=2)
    src, dst = _kv_args(prefill), _kv_args(decode)
    (p_kv, *_), (p_state, *_) = _allocate(prefill, 2, 2)
    d_kv, d_states = _allocate(decode, 3, 3)
    src_kv, src_state = _page_rows(prefill, 1)
    dst_kv, dst_state = _page_rows(decode, 1)
    for tensor in src_kv[p_kv] + src_state[p_state]:
        tensor.copy_(torch.randn(tensor.shape).to(tensor.dtype))
    others = dst_kv[d_kv[0]] + dst_kv[d_kv[2]] + dst_state[d_states[0]] + dst_state[d_states[2]]
    for tensor in others:
        tensor.copy_(torch.randn(tensor.shape).to(tensor.dtype))
    before = [t.clone() for t in others]
    # what the engine does with SGLang's (pointer, item) for one KV page and one state slot
    for a, b, item, (i, j) in (
        (src.kv_data_ptrs[0], dst.kv_data_ptrs[0], src.kv_item_lens[0], (p_kv, d_kv[1])),
        (
            src.state_data_ptrs[0][0],
            dst.state_data_ptrs[0][0],
            src.state_item_lens[0][0],
            (p_state, d_states[1]),
        ),
    ):
        ctypes.memmove(b + j * item, a + i * item, item)
    got = dst_kv[d_kv[1]] + dst_state[d_states[1]]
    for g, want in zip(got, src_kv[p_kv] + src_state[p_state], strict=True):
        assert torch.equal(g, want)
    assert all(torch.equal(a, b) for a, b in zip(others, before, strict=True))  # neighbours


def test_peers_of_another_layout_do_not_pair_with_the_pools_regions(sg: Any) -> None:  # noqa: F811
    from sglang.srt.disaggregation.utils import build_transfer_entry_pairs

    ours = _kv_args(_build(sg))
    same = _kv_args(_build(sg, decode=2, kv_tokens=256))  # a decode pool of another size
    other = _kv_args(_build(sg, head_dim=16))  # other page bytes: another id
    regrouped = _kv_args(_build(sg, heads=1, head_dim=16))  # same bytes, rows laid out otherwise
    assert regrouped.kv_item_lens == ours.kv_item_lens
    stock_ids = [*ATTN, *ATTN]  # SGLang's hybrid pool: K then V of each attention layer

    def pair(src: list[int], dst: list[int]) -> Any:
        return build_transfer_entry_pairs(src, dst, len(src), len(dst))

    assert pair(ours.kv_layer_ids, same.kv_layer_ids) == [(0, 0)]
    assert pair(ours.state_layer_ids[0], same.state_layer_ids[0]) == [(0, 0)]
    for src, dst in (
        (ours.kv_layer_ids, stock_ids),
        (stock_ids, ours.kv_layer_ids),
        (ours.kv_layer_ids, other.kv_layer_ids),
        (ours.kv_layer_ids, regrouped.kv_layer_ids),
        (ours.state_layer_ids[0], list(MAMBA) * 2),
    ):
        with pytest.raises(RuntimeError, match="missing a transfer entry"):
            pair(src, dst)


def test_the_decode_request_pool_has_rows_for_preallocation_over_our_states(sg: Any) -> None:  # noqa: F811
    from sglang.srt.disaggregation.decode import HybridMambaDecodeReqToTokenPool

    from jenga_sglang.binding.pools.allocator import JengaMambaAllocator

    pools = _build(sg, decode=3)
    req = pools.req_to_token_pool
    assert isinstance(req, HybridMambaDecodeReqToTokenPool)
    assert isinstance(req.mamba_allocator, JengaMambaAllocator)
    assert req.req_to_token.shape[0] == 4 + 3 + 1  # running + pre-allocated + padding row
    states = req.mamba_allocator.alloc(2)
    assert states is not None and pools.shared.allocated(pools.shared.state_type) == 2
    req.mamba_allocator.free(states)
    pools.shared.check_integrity()


def test_a_resliced_transfer_of_page_regions_fails_and_others_pass_through(sg: Any) -> None:  # noqa: F811
    from jenga_sglang.binding.pools.transfer import around_resliced

    ours = SimpleNamespace(kv_args=_kv_args(_build(sg)))
    stock = SimpleNamespace(kv_args=SimpleNamespace(kv_layer_ids=[0, 2, 0, 2]))
    calls: list[Any] = []

    def original(manager: Any, *a: Any) -> int:
        calls.append(manager)
        return 0

    assert around_resliced(original, ours, "session") == -1 and calls == []
    assert around_resliced(original, stock, "session") == 0 and calls == [stock]
