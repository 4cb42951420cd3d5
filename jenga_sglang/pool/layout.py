"""Torch views of the Jenga pool: one uint8 buffer, uniformly strided views per page type.

Small page i of type t starts at byte i * s_t (sizing.py), so every view below is an
`as_strided` window on the one buffer whose first dimension is the page id with stride s_t: no
copies, and kernels index it like an ordinary pool (Jenga §4.2).

Inside a page (page-major: page first, then layers):

* KV page of an attention group: [K_0 | V_0 | K_1 | V_1 | ...], each block `tokens_per_page`
  rows of (kv_heads, head_dim). Per layer: K and V views [num_pages, tokens_per_page, kv_heads,
  head_dim].
* SSM state page: [conv_0 | conv_1 | ... | temporal_0 | temporal_1 | ...], each tensor starting
  on an `alignment` boundary (conv and temporal have different dtypes). Per layer:
  [num_pages, *conv_shape] and [num_pages, *temporal_shape]; stacked: [layers, num_pages, ...].

SGLang 0.5.23 compatibility. The page_major.py view builders named in DESIGN are not in the
installed 0.5.23 wheel; its byte-buffer builders live in mem_cache/layout/token_major.py and
paged_view.py. Ours match their shapes where that is meaningful:
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

import torch

from jenga_sglang.models.spec import AttentionGroup, DType, MambaGroup, ModelSpec
from jenga_sglang.pool.sizing import PoolGeometry, state_layout
from jenga_sglang.radix.memory import PageKind, PageType


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
        """K as [slots, kv_heads, head_dim] (tokens_per_page == 1 only)."""
        return _slots(self.k)

    @property
    def v_slots(self) -> torch.Tensor:
        return _slots(self.v)


def _slots(view: torch.Tensor) -> torch.Tensor:
    if view.shape[1] != 1:
        raise ValueError(
            f"slot views need tokens_per_page == 1, got {view.shape[1]}: the slots of one layer "
            "are not uniformly strided across pages"
        )
    return view[:, 0]


@dataclass(frozen=True)
class StateViews:
    """Conv and temporal state of every Mamba layer, indexed by state page id."""

    conv: tuple[torch.Tensor, ...]  # per layer: [num_pages, *conv_shape]
    temporal: tuple[torch.Tensor, ...]  # per layer: [num_pages, *temporal_shape]
    conv_stacked: torch.Tensor  # [layers, num_pages, *conv_shape]
    temporal_stacked: torch.Tensor  # [layers, num_pages, *temporal_shape]


@dataclass(frozen=True)
class PoolLayout:
    """The buffer of a pool and its views. `kv[t][l]` is layer l of the group of type t."""

    geometry: PoolGeometry
    num_large: int
    buffer: torch.Tensor
    kv: dict[PageType, tuple[KVLayerViews, ...]]
    state: dict[PageType, StateViews]

    def page_bytes(self, ptype: PageType, page: int) -> torch.Tensor:
        """The raw bytes of one small page (a uint8 view)."""
        stride = self.geometry.of(ptype).page_bytes
        return self.buffer[page * stride : (page + 1) * stride]


def build_layout(
    geometry: PoolGeometry, spec: ModelSpec, num_large: int, *, device: str = "cpu"
) -> PoolLayout:
    """Allocate num_large * L bytes on `device` and build every type's views over them."""
    if num_large <= 0:
        raise ValueError(f"num_large must be positive, got {num_large}")
    buffer = torch.zeros(num_large * geometry.large_page_bytes, dtype=torch.uint8, device=device)
    kv: dict[PageType, tuple[KVLayerViews, ...]] = {}
    state: dict[PageType, StateViews] = {}
    for ptype in geometry.page_types:
        group = spec.groups[ptype.group]
        pages = num_large * geometry.of(ptype).per_large
        stride = geometry.of(ptype).page_bytes
        if ptype.kind is PageKind.KV and isinstance(group, AttentionGroup):
            kv[ptype] = _kv_views(buffer, group, pages, stride, geometry.tokens_per_page)
        elif ptype.kind is PageKind.STATE and isinstance(group, MambaGroup):
            state[ptype] = _state_views(buffer, group, pages, stride, geometry.alignment)
        else:
            raise ValueError(f"page type {ptype} does not match group {group.name!r} of the spec")
    return PoolLayout(geometry, num_large, buffer, kv, state)


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
    buffer: torch.Tensor, group: AttentionGroup, pages: int, stride: int, tpp: int
) -> tuple[KVLayerViews, ...]:
    dtype = torch_dtype(group.dtype)
    row = (group.num_kv_heads, group.head_dim)
    block = tpp * math.prod(row) * dtype.itemsize  # one layer's K (or V) in one page
    typed = _typed(buffer, dtype, stride, block)
    item = dtype.itemsize
    shape = (pages, tpp, *row)
    strides = (stride // item, *_contiguous((tpp, *row)))

    def at(offset: int) -> torch.Tensor:
        return typed.as_strided(shape, strides, offset // item)

    return tuple(
        KVLayerViews(k=at(2 * layer * block), v=at((2 * layer + 1) * block))
        for layer in range(group.num_layers)
    )


def _state_views(
    buffer: torch.Tensor, group: MambaGroup, pages: int, stride: int, alignment: int
) -> StateViews:
    lay = state_layout(group, alignment)
    conv, conv_stacked = _tensor_views(
        buffer,
        group.conv_dtype,
        group.conv_shape,
        (pages, stride),
        (0, lay.conv_stride),
        group.num_layers,
    )
    temporal, temporal_stacked = _tensor_views(
        buffer,
        group.temporal_dtype,
        group.temporal_shape,
        (pages, stride),
        (lay.temporal_offset, lay.temporal_stride),
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
