"""Torch views of the Jenga pool: one uint8 buffer, uniformly strided views per page type.

Small page i of type t starts at byte i * s_t (sizing.py), so every view below is an
`as_strided` window on the one buffer whose first dimension is the page id with stride s_t: no
copies, and kernels index it like an ordinary pool (Jenga §4.2).

Inside a page (page-major: page first, then layers):

* KV page of an attention group: [K_0 | V_0 | K_1 | V_1 | ...], each block `tokens_per_page`
  rows of (kv_heads, head_dim). Per layer: K and V views [num_pages, tokens_per_page, kv_heads,
  head_dim]. `token_major=True` (SGLang's pools with --page-size > 1) orders a page by token
  instead: [token 0: K_0 | V_0 | K_1 | ...][token 1: ...], so that with unpadded pages a
  layer's token slots are uniformly strided across pages, and slot t of an engine page p is
  row p * tokens_per_page + t of `k_slots`.
* SSM state page: [conv_0 | conv_1 | ... | temporal_0 | temporal_1 | ...], each tensor starting
  on an `alignment` boundary (conv and temporal have different dtypes). Per layer:
  [num_pages, *conv_shape] and [num_pages, *temporal_shape]; stacked: [layers, num_pages, ...].

Sink row (`sink=True`, for SGLang's pools, binding/pools/sglang_pool.py). SGLang reserves slot 0 of
its KV and Mamba pools as the write target of padded tokens. The buffer then starts with a sink
of `sink_bytes` = max page size rounded up to `alignment`, and every view gets one more row in
front: row 0 ends where large page 0 starts (inside the sink) and row i >= 1 is pool page i - 1.
The sink rows of different types overlap each other (garbage by contract), never a page.

SGLang 0.5.23 compatibility. The wheel has no page-major view builder (only the
`--enable-page-major-kv-layout` flag, which `--jenga-pool` rejects); its byte-buffer builders
live in mem_cache/layout/token_major.py and paged_view.py. Ours match their shapes where that is
meaningful:
* `paged_view`/`paged_kv_view` give [num_pages, page_size, head_num, head_dim]: our K/V views
  have this shape. With tokens_per_page == 1, `KVLayerViews.k_slots` is the [slots, heads,
  head_dim] per-layer view of `build_dense_views` (slot stride = page bytes instead of entry
  bytes). With tokens_per_page > 1 the slots of one layer are not uniformly strided (the other
  layers sit between pages), so only the paged 4-D view exists.
* `build_mamba_entry_views` returns (num_layers, max_slots, *inner_shape) per tensor with layer
  stride = unpadded tensor bytes; our stacked views have the same shape but a layer stride
  rounded up to `alignment`, and a single conv tensor per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from jenga_sglang.models.spec import AttentionGroup, DType, MambaGroup, ModelSpec
from jenga_sglang.pool.sizing import PoolGeometry, round_up, state_layout
from jenga_sglang.radix.pages import PageKind, PageType


def torch_dtype(dtype: DType) -> torch.dtype:
    """The torch element type of a spec dtype (FP8 is e4m3fn)."""
    return torch.float8_e4m3fn if dtype is DType.FP8 else getattr(torch, dtype.torch_name)


@dataclass(frozen=True)
class KVLayerViews:
    """K and V of one attention layer: [num_pages, tokens_per_page, kv_heads, head_dim]."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def k_slots(self) -> torch.Tensor:
        """K as [slots, kv_heads, head_dim] (tokens_per_page == 1, or a token-major layout
        of unpadded pages)."""
        return _slots(self.k)

    @property
    def v_slots(self) -> torch.Tensor:
        return _slots(self.v)


def _slots(view: torch.Tensor) -> torch.Tensor:
    if view.shape[1] == 1:
        return view[:, 0]
    if view.stride(0) != view.shape[1] * view.stride(1):
        raise ValueError(
            f"slot views need tokens_per_page == 1 or a token-major layout of unpadded pages "
            f"(got {view.shape[1]} tokens a page, strides {view.stride()[:2]}): the slots of "
            "one layer are not uniformly strided across pages"
        )
    return view.flatten(0, 1)


@dataclass(frozen=True)
class StateViews:
    """Conv and temporal state of every Mamba layer, indexed by state page id."""

    conv: tuple[torch.Tensor, ...]  # per layer: [num_pages, *conv_shape]
    temporal: tuple[torch.Tensor, ...]  # per layer: [num_pages, *temporal_shape]
    conv_stacked: torch.Tensor  # [layers, num_pages, *conv_shape]
    temporal_stacked: torch.Tensor  # [layers, num_pages, *temporal_shape]


class PageRegion(NamedTuple):
    """One page type's rows as a transfer engine addresses them: row r is the bytes
    [ptr + r * item_len, + item_len), a whole small page (every layer's K and V, or conv and
    temporal state); `length` covers every row, the sink row included."""

    ptr: int
    length: int
    item_len: int


@dataclass(frozen=True)
class PoolLayout:
    """The buffer of a pool and its views. `kv[t][l]` is layer l of the group of type t."""

    geometry: PoolGeometry
    num_large: int
    buffer: torch.Tensor
    kv: dict[PageType, tuple[KVLayerViews, ...]]
    state: dict[PageType, StateViews]
    sink_bytes: int = 0  # bytes before large page 0; > 0 iff views have a sink row 0

    @property
    def first_row(self) -> int:
        """View row of pool page 0 (1 with a sink row, else 0)."""
        return 1 if self.sink_bytes else 0

    def page_bytes(self, ptype: PageType, page: int) -> torch.Tensor:
        """The raw bytes of one small page (a uint8 view)."""
        stride = self.geometry.of(ptype).page_bytes
        start = self.sink_bytes + page * stride
        return self.buffer[start : start + stride]

    def region(self, ptype: PageType) -> PageRegion:
        """The rows of `ptype`'s views as one region (row numbering as the views': a sink
        row 0 ends where large page 0 starts, so every row lies inside the buffer)."""
        tg = self.geometry.of(ptype)
        rows = self.num_large * tg.per_large + self.first_row
        origin = self.sink_bytes - tg.page_bytes if self.sink_bytes else 0
        return PageRegion(self.buffer.data_ptr() + origin, rows * tg.page_bytes, tg.page_bytes)


class _Rows(NamedTuple):
    """The rows of one type's views: how many, their stride and the byte where row 0 starts."""

    num: int
    stride: int
    origin: int = 0


def sink_size(geometry: PoolGeometry) -> int:
    """Bytes of the sink in front of large page 0: one row of the largest type, aligned."""
    return round_up(max(tg.page_bytes for tg in geometry.types), max(geometry.alignment, 1))


def build_layout(
    geometry: PoolGeometry,
    spec: ModelSpec,
    num_large: int,
    *,
    device: str = "cpu",
    sink: bool = False,
    token_major: bool = False,
) -> PoolLayout:
    """Allocate num_large * L bytes (plus the sink) on `device` and build every type's views
    (`token_major`: KV pages ordered by token, module doc)."""
    if num_large <= 0:
        raise ValueError(f"num_large must be positive, got {num_large}")
    sink_bytes = sink_size(geometry) if sink else 0
    size = sink_bytes + num_large * geometry.large_page_bytes
    buffer = torch.zeros(size, dtype=torch.uint8, device=device)
    kv: dict[PageType, tuple[KVLayerViews, ...]] = {}
    state: dict[PageType, StateViews] = {}
    for ptype in geometry.page_types:
        group = spec.groups[ptype.group]
        stride = geometry.of(ptype).page_bytes
        count = num_large * geometry.of(ptype).per_large + int(sink)
        rows = _Rows(count, stride, sink_bytes - stride if sink else 0)
        if ptype.kind is PageKind.KV and isinstance(group, AttentionGroup):
            kv[ptype] = _kv_views(buffer, group, rows, geometry.tokens_per_page, token_major)
        elif ptype.kind is PageKind.STATE and isinstance(group, MambaGroup):
            state[ptype] = _state_views(buffer, group, rows, geometry.alignment)
        else:
            raise ValueError(f"page type {ptype} does not match group {group.name!r} of the spec")
    return PoolLayout(geometry, num_large, buffer, kv, state, sink_bytes)


def _typed(buffer: torch.Tensor, dtype: torch.dtype, *byte_counts: int) -> torch.Tensor:
    """`buffer` reinterpreted as dtype; every byte offset/stride must be whole elements."""
    size = dtype.itemsize
    bad = [n for n in byte_counts if n % size]
    if bad:
        raise ValueError(f"byte offsets/strides {bad} are not multiples of {dtype} ({size} B)")
    return buffer.view(dtype)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


def _kv_views(
    buffer: torch.Tensor, group: AttentionGroup, rows: _Rows, tpp: int, token_major: bool
) -> tuple[KVLayerViews, ...]:
    dtype = torch_dtype(group.dtype)
    row = (group.num_kv_heads, group.head_dim)
    item = dtype.itemsize
    shape = (rows.num, tpp, *row)
    if token_major:  # a token's K and V of every layer, then the next token's
        block = math.prod(row) * item  # one layer's K (or V) of one token
        token = 2 * group.num_layers * block
        strides = (rows.stride // item, token // item, *_contiguous(row))
    else:  # one layer's K (or V) of every token of the page, then the next
        block = tpp * math.prod(row) * item
        strides = (rows.stride // item, *_contiguous((tpp, *row)))
    typed = _typed(buffer, dtype, rows.stride, block, rows.origin)

    def at(offset: int) -> torch.Tensor:
        return typed.as_strided(shape, strides, (rows.origin + offset) // item)

    return tuple(
        KVLayerViews(k=at(2 * layer * block), v=at((2 * layer + 1) * block))
        for layer in range(group.num_layers)
    )


def _state_views(
    buffer: torch.Tensor, group: MambaGroup, rows: _Rows, alignment: int
) -> StateViews:
    lay = state_layout(group, alignment)
    conv, conv_stacked = _tensor_views(
        buffer,
        group.conv_dtype,
        group.conv_shape,
        (rows.num, rows.stride),
        (rows.origin, lay.conv_stride),
        group.num_layers,
    )
    temporal, temporal_stacked = _tensor_views(
        buffer,
        group.temporal_dtype,
        group.temporal_shape,
        (rows.num, rows.stride),
        (rows.origin + lay.temporal_offset, lay.temporal_stride),
        group.num_layers,
    )
    return StateViews(conv, temporal, conv_stacked, temporal_stacked)


def _tensor_views(
    buffer: torch.Tensor,
    spec_dtype: DType,
    inner: tuple[int, ...],
    pages_and_stride: tuple[int, int],
    base_and_layer_stride: tuple[int, int],
    layers: int,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Per-layer [pages, *inner] views and the stacked [layers, pages, *inner] view.

    Layer i of a page starts at byte base + i * layer_stride of the page.
    """
    pages, page_stride = pages_and_stride
    base, layer_stride = base_and_layer_stride
    dtype = torch_dtype(spec_dtype)
    typed = _typed(buffer, dtype, page_stride, base, layer_stride)
    item = dtype.itemsize
    inner_strides = _contiguous(inner)
    per_layer = tuple(
        typed.as_strided(
            (pages, *inner),
            (page_stride // item, *inner_strides),
            (base + i * layer_stride) // item,
        )
        for i in range(layers)
    )
    stacked = typed.as_strided(
        (layers, pages, *inner),
        (layer_stride // item, page_stride // item, *inner_strides),
        base // item,
    )
    return per_layer, stacked
