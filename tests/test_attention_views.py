"""SGLang's Triton attention kernels read the Jenga pool's KV views right (Triton interpreter).

Per layer, a K/V slot of the Jenga pool is a row of a strided view whose row stride is a whole
KV page (page size 1) or one token of every layer (token-major pages, page size > 1), not the
row's own `kv_heads x head_dim` (pool/layout.py). SGLang's Triton backend hands
`get_key_buffer(layer_id)` / `get_value_buffer(layer_id)` of its KV pool straight to its extend,
deterministic-extend and decode kernels (sglang/srt/layers/attention/triton_backend.py
`forward_extend`, `_forward_extend_unified`, `forward_decode`), with token slot ids in
`kv_indices` and `page_size` = `--page-size`.

Here those kernels run on the views the server builds (binding/pool_build.py over our layout:
the Mamba-hybrid pool and the sliding-window pool of a gpt-oss-like model, with its window
lists, window size and attention sinks) and again on contiguous copies holding the same values:
the outputs must be equal bit for bit, and close to a float64 reference (so neither run reads
nothing). A view with the contiguous row stride over the same bytes must give other outputs:
that is what a kernel ignoring the row stride would read, and the comparison catches it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import triton_cpu  # noqa: F401  # the interpreter patches, before SGLang's kernels import triton

pytestmark = [
    pytest.mark.exactness,
    pytest.mark.sglang,
    # Masked-out lanes (empty KV splits, query rows past a request's end) compute -inf - -inf
    # and exp(sink + inf) under the interpreter and are never stored; numpy warns, CUDA does not.
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
]

HQ, HKV, D = 4, 2, 16  # query heads, KV heads (GQA groups of 2), head dim
WINDOW = 24
SWS = WINDOW - 1  # SGLang's sliding_window_size for gpt-oss: config.sliding_window - 1
PAGES = (1, 16, 64)
MAX_KV_SPLITS = 8  # SGLang's default --triton-attention-num-kv-splits
EXTEND = ((0, 12), (70, 20), (130, 9))  # (prefix, new tokens) per request
DECODE = (5, 96, 150)  # tokens per request, the new one included
FLOAT = torch.float32  # the interpreter computes bfloat16 dot products on the raw bits


@pytest.fixture(scope="module")
def sg() -> SimpleNamespace:
    from sglang.kernels.ops.attention import decode_attention as dec
    from sglang.kernels.ops.attention import extend_attention as ext
    from sglang.test.unified_allocator_fixtures import setup_allocator_context

    setup_allocator_context()
    return SimpleNamespace(
        extend=ext.extend_attention_fwd,
        unified=ext.extend_attention_fwd_unified,
        unified_indices=ext.build_unified_kv_indices,
        decode=dec.decode_attention_fwd,
    )


@dataclass(frozen=True)
class Layer:
    """What the Triton backend passes for one layer: the pool's K and V buffers of that layer,
    its sliding window (-1: full attention) and sinks; `pages` are the engine pages its
    requests may take (never page 0, the sink)."""

    k: torch.Tensor
    v: torch.Tensor
    page: int
    pages: tuple[int, ...]
    window: int = -1
    sinks: torch.Tensor | None = None

    def contiguous(self) -> Layer:
        return replace(self, k=self.k.contiguous(), v=self.v.contiguous())

    def row_stride_ignored(self) -> Layer:
        """The same bytes read as if a row were `kv_heads x head_dim` long."""
        return replace(self, k=_entry_strided(self.k), v=_entry_strided(self.v))


#: A kernel call as a function of the layer it reads, and its float64 reference.
Kernel = tuple[Callable[[Layer], torch.Tensor], Callable[[Layer], torch.Tensor]]


def _entry_strided(view: torch.Tensor) -> torch.Tensor:
    return view.as_strided(view.shape, (HKV * D, D, 1), view.storage_offset())


def _fill(layout: Any, gen: torch.Generator) -> None:
    """Distinct values in every KV row of every layer and type (neighbours included)."""
    for layers in layout.kv.values():
        for views in layers:
            for view in (views.k, views.v):
                view.copy_(torch.randn(view.shape, generator=gen, dtype=FLOAT))


def _engine_pages(
    rows: int, page: int, large_pages: Sequence[int], per_large: int
) -> tuple[int, ...]:
    """Engine pages (rows // page of the view; 0 is the sink) inside the given large pages."""
    return tuple(p for p in range(1, rows // page) if (p - 1) // per_large in large_pages)


def _mamba_hybrid_layer(page: int, gen: torch.Generator) -> Layer:
    """The last full-attention layer of a Mamba hybrid's pool (layers 0, 2 Mamba, 1, 3
    attention), as binding/pool_hook.py builds it."""
    from jenga_sglang.binding.pool_build import (
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
    _fill(pools.layout, gen)
    k, v = pools.token_to_kv_pool.get_kv_buffer(3)
    geometry = pools.layout.geometry
    large = range(pools.layout.num_large)
    pages = _engine_pages(k.shape[0], page, large, geometry.of(KV_TYPE).per_large)
    return Layer(k, v, page, pages)


def _swa_layers(page: int, gen: torch.Generator) -> tuple[Layer, Layer]:
    """The last window layer and the last full layer of a gpt-oss-like pool (layers 0, 2
    sliding window, 1, 3 full, sinks on every layer), as binding/swa_pool_hook.py builds it.
    Full and window pages come from different large pages, as the pool carves them."""
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    from jenga_sglang.binding.pool_build import (
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
    _fill(pools.layout, gen)
    geometry, num_large = pools.layout.geometry, pools.layout.num_large

    def layer(layer_id: int, ptype: Any, parity: int, window_size: int) -> Layer:
        k, v = pools.token_to_kv_pool.get_kv_buffer(layer_id)
        large = range(parity, num_large, 2)
        pages = _engine_pages(k.shape[0], page, large, geometry.of(ptype).per_large)
        sinks = torch.randn(HQ, generator=gen, dtype=FLOAT)
        return Layer(k, v, page, pages, window_size, sinks)

    return layer(2, WINDOW_TYPE, 0, SWS), layer(3, FULL_TYPE, 1, -1)


def _request_slots(
    layer: Layer, lengths: Sequence[int], gen: torch.Generator
) -> list[torch.Tensor]:
    """Token slot ids of each request (position t on engine page pages[t // P], slot
    t % P), on pages scattered over the pool in random order."""
    order = torch.randperm(len(layer.pages), generator=gen).tolist()
    free = [layer.pages[i] for i in order]
    slots = []
    for length in lengths:
        count = -(-length // layer.page)
        pages, free = torch.tensor(free[:count]), free[count:]
        t = torch.arange(length)
        slots.append(pages[t // layer.page] * layer.page + t % layer.page)
    return slots


def _read_start(end: int, window: int) -> int:
    """First position of the KV list a request reads up to `end`: all of it on a full layer,
    the last `window` positions on a sliding-window one (triton_backend.py
    `update_sliding_window_buffer`)."""
    return 0 if window < 0 else max(0, end - window)


def _indptr(lengths: Sequence[int], dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(list(lengths)).cumsum(0).tolist()], dtype=dtype)


@dataclass(frozen=True)
class Extend:
    """A prefill batch: per request the slots of the KV it reads from the pool (`lists`,
    positions `starts[i]` on) and of its new tokens (`chunks`, positions `prefixes[i]` on)."""

    q: torch.Tensor
    k_new: torch.Tensor
    v_new: torch.Tensor
    prefixes: tuple[int, ...]
    starts: tuple[int, ...]
    lists: tuple[torch.Tensor, ...]
    chunks: tuple[torch.Tensor, ...]

    @property
    def new(self) -> list[int]:
        return [len(chunk) for chunk in self.chunks]


def _extend_batch(layer: Layer, gen: torch.Generator) -> Extend:
    slots = _request_slots(layer, [p + e for p, e in EXTEND], gen)
    starts = tuple(_read_start(p, layer.window) for p, _ in EXTEND)
    new = sum(e for _, e in EXTEND)
    return Extend(
        q=torch.randn(new, HQ, D, generator=gen, dtype=FLOAT),
        k_new=torch.randn(new, HKV, D, generator=gen, dtype=FLOAT),
        v_new=torch.randn(new, HKV, D, generator=gen, dtype=FLOAT),
        prefixes=tuple(p for p, _ in EXTEND),
        starts=starts,
        lists=tuple(s[a:p] for s, a, (p, _) in zip(slots, starts, EXTEND, strict=True)),
        chunks=tuple(s[p : p + e] for s, (p, e) in zip(slots, EXTEND, strict=True)),
    )


def _extend(sg: SimpleNamespace, batch: Extend, layer: Layer) -> torch.Tensor:
    """`forward_extend`'s call: new K/V passed in, the prefix (or window) read from the pool."""
    out = torch.empty_like(batch.q)
    offsets = None if layer.window < 0 else torch.tensor(batch.starts)
    sg.extend(
        batch.q,
        batch.k_new,
        batch.v_new,
        out,
        layer.k,
        layer.v,
        _indptr(batch.new, torch.int64),
        _indptr([len(x) for x in batch.lists]),
        torch.cat(batch.lists),
        None,  # custom mask
        True,  # causal
        None,  # mask indptr
        max(batch.new),
        1.0,  # k scale
        1.0,  # v scale
        D**-0.5,
        logit_cap=0.0,
        sliding_window_size=layer.window,
        sinks=layer.sinks,
        window_kv_offsets=offsets,
        xai_temperature_len=-1,
        page_size=layer.page,
        extend_seq_lens_cpu=batch.new,
    )
    return out


def _unified(sg: SimpleNamespace, batch: Extend, layer: Layer) -> torch.Tensor:
    """`_forward_extend_unified`'s call (--enable-deterministic-inference): prefix and new
    tokens both read from the pool; window lists padded to absolute tiles first."""
    from sglang.kernels.ops.attention.extend_attention import align_window_kv_to_tiles

    bs = len(batch.lists)
    indptr, indices = _indptr([len(x) for x in batch.lists]), torch.cat(batch.lists)
    start_pos = None
    if layer.window >= 0:
        starts = torch.tensor(batch.starts, dtype=torch.int32)
        indptr, indices = align_window_kv_to_tiles(indptr, indices, starts, bs)
        start_pos = torch.tensor(batch.prefixes, dtype=torch.int32) - indptr.diff()
    new = torch.tensor(batch.new, dtype=torch.int32)
    unified_indptr, unified_indices, prefix_lens = sg.unified_indices(
        indptr, indices, _indptr(batch.new)[:-1], new, torch.cat(batch.chunks), bs
    )
    out = torch.empty_like(batch.q)
    sg.unified(
        batch.q,
        out,
        layer.k,
        layer.v,
        1.0,
        1.0,
        _indptr(batch.new, torch.int64),
        unified_indptr,
        unified_indices,
        prefix_lens.to(torch.int32),
        max(batch.new),
        sm_scale=D**-0.5,
        logit_cap=0.0,
        is_causal=True,
        sliding_window_size=layer.window,
        sinks=layer.sinks,
        window_start_pos=start_pos,
        xai_temperature_len=-1,
        page_size=layer.page,
    )
    return out


@dataclass(frozen=True)
class Decode:
    """A decode batch: per request the slots of the KV it reads (its new token's included),
    positions `starts[i]` to `ends[i] - 1`."""

    q: torch.Tensor
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    lists: tuple[torch.Tensor, ...]


def _decode_batch(layer: Layer, gen: torch.Generator) -> Decode:
    slots = _request_slots(layer, DECODE, gen)
    starts = tuple(_read_start(n, layer.window) for n in DECODE)
    return Decode(
        q=torch.randn(len(DECODE), HQ, D, generator=gen, dtype=FLOAT),
        starts=starts,
        ends=DECODE,
        lists=tuple(s[a:] for s, a in zip(slots, starts, strict=True)),
    )


def _decode(sg: SimpleNamespace, batch: Decode, layer: Layer) -> torch.Tensor:
    """`forward_decode`'s call: all KV read from the pool, split into KV chunks."""
    bs = len(batch.lists)
    out = torch.empty_like(batch.q)
    sg.decode(
        batch.q,
        layer.k,
        layer.v,
        out,
        _indptr([len(x) for x in batch.lists]),
        torch.cat(batch.lists),
        torch.empty(bs, HQ, MAX_KV_SPLITS, D, dtype=FLOAT),  # attn logits
        torch.empty(bs, HQ, MAX_KV_SPLITS, dtype=FLOAT),  # attn lse
        torch.tensor([1, 3, MAX_KV_SPLITS][:bs], dtype=torch.int32),  # KV splits per request
        MAX_KV_SPLITS,
        D**-0.5,
        1.0,
        1.0,
        logit_cap=0.0,
        sinks=layer.sinks,
        xai_temperature_len=-1,
        has_mla=False,
        use_pdl=False,
        page_size=layer.page,
        enable_lean=False,
    )
    return out


def _attend(
    q: torch.Tensor,
    q_pos: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    k_pos: torch.Tensor,
    layer: Layer,
) -> torch.Tensor:
    """float64 attention of one request: causal, within the window, with the sinks in the
    softmax denominator; K/V heads shared by groups of query heads."""
    k, v = (x.double().repeat_interleave(HQ // HKV, dim=1) for x in (keys, values))
    scores = torch.einsum("qhd,nhd->hqn", q.double(), k) * D**-0.5
    allowed = k_pos[None, :] <= q_pos[:, None]
    if layer.window >= 0:
        allowed &= q_pos[:, None] <= k_pos[None, :] + layer.window
    scores = scores.masked_fill(~allowed, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    weights = (scores - top).exp()
    denominator = weights.sum(-1, keepdim=True)
    if layer.sinks is not None:
        denominator = denominator + (layer.sinks.double()[:, None, None] - top).exp()
    return torch.einsum("hqn,nhd->qhd", weights / denominator, v)


def _extend_reference(batch: Extend, layer: Layer, unified: bool) -> torch.Tensor:
    """Per request: the listed pool rows, then the new tokens (passed in, or read from the
    pool by the deterministic kernel)."""
    outs, first = [], 0
    for start, prefix, rows, chunk in zip(
        batch.starts, batch.prefixes, batch.lists, batch.chunks, strict=True
    ):
        new = slice(first, first + len(chunk))
        first = new.stop
        k_new, v_new = (
            (layer.k[chunk], layer.v[chunk]) if unified else (batch.k_new[new], batch.v_new[new])
        )
        keys = torch.cat([layer.k[rows], k_new])
        values = torch.cat([layer.v[rows], v_new])
        k_pos = torch.arange(start, prefix + len(chunk))
        outs.append(_attend(batch.q[new], k_pos[-len(chunk) :], keys, values, k_pos, layer))
    return torch.cat(outs)


def _decode_reference(batch: Decode, layer: Layer) -> torch.Tensor:
    outs = [
        _attend(
            batch.q[i : i + 1],
            torch.tensor([end - 1]),
            layer.k[rows],
            layer.v[rows],
            torch.arange(start, end),
            layer,
        )
        for i, (start, end, rows) in enumerate(
            zip(batch.starts, batch.ends, batch.lists, strict=True)
        )
    ]
    return torch.cat(outs)


def _runs(sg: SimpleNamespace, layer: Layer, gen: torch.Generator) -> dict[str, Kernel]:
    """The three kernels on one prefill and one decode batch of this layer's requests."""
    extend, decode = _extend_batch(layer, gen), _decode_batch(layer, gen)
    return {
        "extend": (lambda x: _extend(sg, extend, x), lambda x: _extend_reference(extend, x, False)),
        "deterministic extend": (
            lambda x: _unified(sg, extend, x),
            lambda x: _extend_reference(extend, x, True),
        ),
        "decode": (lambda x: _decode(sg, decode, x), lambda x: _decode_reference(decode, x)),
    }


def _assert_read_right(sg: SimpleNamespace, layer: Layer, gen: torch.Generator) -> None:
    dense = layer.contiguous()
    for name, (run, reference) in _runs(sg, layer, gen).items():
        got = run(layer)
        assert torch.equal(got, run(dense)), f"{name}: pool views and contiguous copies differ"
        want = reference(dense).to(FLOAT)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), f"{name}: far from reference"


def _assert_pool_strides(layer: Layer, layers_in_group: int) -> None:
    """The premise: a row of the view spans K and V of every layer of the group (the pool's
    slot stride), V sits right after K, and the rows are not contiguous."""
    row = HKV * D
    assert layer.k.stride() == layer.v.stride() == (2 * layers_in_group * row, D, 1)
    assert layer.v.data_ptr() - layer.k.data_ptr() == row * layer.k.element_size()
    assert not layer.k.is_contiguous()


@pytest.mark.parametrize("page", PAGES)
def test_triton_kernels_read_the_mamba_hybrid_pool_views_bit_for_bit(
    sg: SimpleNamespace, page: int
) -> None:
    gen = torch.Generator().manual_seed(page)
    layer = _mamba_hybrid_layer(page, gen)
    _assert_pool_strides(layer, layers_in_group=2)
    _assert_read_right(sg, layer, gen)


@pytest.mark.parametrize("page", PAGES)
def test_triton_kernels_read_the_sliding_window_pool_views_bit_for_bit(
    sg: SimpleNamespace, page: int
) -> None:
    """gpt-oss's layers: a window layer reads its window list (last SWS positions) with the
    window mask, a full layer everything; both with attention sinks."""
    gen = torch.Generator().manual_seed(100 + page)
    for layer in _swa_layers(page, gen):
        _assert_pool_strides(layer, layers_in_group=2)
        _assert_read_right(sg, layer, gen)


@pytest.mark.parametrize("page", PAGES)
def test_a_kernel_ignoring_the_row_stride_would_be_caught(sg: SimpleNamespace, page: int) -> None:
    """The bytes at the contiguous row stride are other tokens' (and layers') K and V, so a
    kernel that read the views as contiguous would fail the comparison above."""
    gen = torch.Generator().manual_seed(200 + page)
    window, _ = _swa_layers(page, gen)
    for layer in (_mamba_hybrid_layer(page, gen), window):
        wrong = layer.row_stride_ignored()
        for name, (run, _) in _runs(sg, layer, gen).items():
            assert not torch.equal(run(layer), run(wrong)), name
