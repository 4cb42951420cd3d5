"""Page sizes of the Jenga pool: one small-page type per cache kind, one large page for all.

Small-page types (how the pool carves them: pool/pool.py):

* one KV type per attention group: a page holds `tokens_per_page` tokens of K and V for every
  layer of the group (`tokens_per_page * AttentionGroup.kv_bytes_per_token` bytes);
* one SSM state type when the model has Mamba layers: a page is one whole checkpoint, the conv
  state of every Mamba layer followed by the temporal state of every Mamba layer. Conv and
  temporal tensors have different dtypes, so each tensor starts on an `alignment`-byte boundary.

The large page size L is the least common multiple of the small sizes, so every type tiles a
large page exactly and small page i of type t can sit at byte i * s_t of one buffer. Exact LCMs of
arbitrary byte sizes can explode, so L is bounded by `max_ratio` x the largest small size. Above
the bound, every small size is padded up to a multiple of a common granule g; the padded sizes
share the factor g, which keeps their LCM small. g is chosen among multiples of `alignment` to
minimise the worst per-type padding (ties: smaller L) subject to L <= bound. Padding is reported
per type in bytes and percent of the padded page.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from jenga_sglang.models.spec import AttentionGroup, MambaGroup, ModelSpec
from jenga_sglang.radix.pages import PageKind, PageType

DEFAULT_ALIGNMENT = 256
DEFAULT_MAX_RATIO = 64


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class StateLayout:
    """Byte layout of one SSM state page: conv of every layer, then temporal of every layer."""

    num_layers: int
    conv_stride: int  # bytes between consecutive layers' conv tensors (aligned)
    temporal_stride: int  # bytes between consecutive layers' temporal tensors (aligned)

    @property
    def temporal_offset(self) -> int:
        return self.num_layers * self.conv_stride

    @property
    def size(self) -> int:
        return self.num_layers * (self.conv_stride + self.temporal_stride)


def state_layout(group: MambaGroup, alignment: int = DEFAULT_ALIGNMENT) -> StateLayout:
    return StateLayout(
        num_layers=group.num_layers,
        conv_stride=round_up(group.conv_bytes, alignment),
        temporal_stride=round_up(group.temporal_bytes, alignment),
    )


@dataclass(frozen=True)
class TypeGeometry:
    """One small-page type: payload bytes, bytes it occupies (its stride), pages per large page."""

    ptype: PageType
    data_bytes: int  # tensor bytes actually stored in one page
    page_bytes: int  # stride of the type in the buffer: data + alignment + granule padding
    per_large: int  # small pages of this type in one large page

    @property
    def padding_bytes(self) -> int:
        return self.page_bytes - self.data_bytes

    @property
    def padding_percent(self) -> float:
        return 100.0 * self.padding_bytes / self.page_bytes


@dataclass(frozen=True)
class PoolGeometry:
    """Sizes of every small-page type and of the large page (see the module docstring)."""

    types: tuple[TypeGeometry, ...]
    large_page_bytes: int
    exact_lcm: int  # LCM of the unpadded (aligned) sizes, for reports
    granule: int  # 1 when no granule padding was needed
    max_ratio: int
    alignment: int
    tokens_per_page: int

    def __post_init__(self) -> None:
        for tg in self.types:
            if tg.per_large * tg.page_bytes != self.large_page_bytes:
                raise ValueError(
                    f"{tg.ptype}: {tg.per_large} pages of {tg.page_bytes} bytes do not tile a "
                    f"{self.large_page_bytes}-byte large page"
                )

    @property
    def page_types(self) -> tuple[PageType, ...]:
        return tuple(tg.ptype for tg in self.types)

    def of(self, ptype: PageType) -> TypeGeometry:
        for tg in self.types:
            if tg.ptype == ptype:
                return tg
        raise KeyError(f"page type {ptype} not in this geometry ({list(map(str, self.types))})")


def compute_geometry(
    sizes: Mapping[PageType, int],
    *,
    data_bytes: Mapping[PageType, int] | None = None,
    alignment: int = 1,
    max_ratio: int = DEFAULT_MAX_RATIO,
    tokens_per_page: int = 1,
) -> PoolGeometry:
    """Geometry for small pages of `sizes` bytes (already aligned); see the module docstring.

    `data_bytes` gives the payload of each type when `sizes` already include alignment padding
    (default: the sizes themselves).
    """
    if not sizes:
        raise ValueError("a pool needs at least one page type")
    if alignment <= 0 or max_ratio < 1:
        raise ValueError(f"alignment {alignment} and max_ratio {max_ratio} must be >= 1")
    bad = {str(t): s for t, s in sizes.items() if s <= 0}
    if bad:
        raise ValueError(f"page sizes must be positive, got {bad}")
    data = dict(sizes) if data_bytes is None else dict(data_bytes)
    exact = math.lcm(*sizes.values())
    bound = max_ratio * max(sizes.values())
    granule, large = (1, exact) if exact <= bound else _pick_granule(sizes, alignment, bound)
    types = tuple(
        TypeGeometry(
            ptype=t,
            data_bytes=data[t],
            page_bytes=round_up(s, granule),
            per_large=large // round_up(s, granule),
        )
        for t, s in sizes.items()
    )
    return PoolGeometry(types, large, exact, granule, max_ratio, alignment, tokens_per_page)


def _pick_granule(sizes: Mapping[PageType, int], alignment: int, bound: int) -> tuple[int, int]:
    """(granule, L): least worst-case padding fraction with L <= bound; ties to smaller L."""
    biggest = max(sizes.values())
    candidates = {round_up(biggest, alignment)}  # everything padded to one size: L = g
    for odd in (1, 3, 5, 7):
        g = alignment * odd
        while g < biggest:
            candidates.add(g)
            g *= 2
    best: tuple[float, int, int] | None = None
    for g in sorted(candidates):
        padded = [round_up(s, g) for s in sizes.values()]
        large = math.lcm(*padded)
        if large > bound:
            continue
        worst = max((p - s) / p for p, s in zip(padded, sizes.values(), strict=True))
        if best is None or (worst, large) < best[:2]:
            best = (worst, large, g)
    if best is None:
        raise ValueError(
            f"no granule keeps the large page under {bound} bytes for sizes "
            f"{sorted(sizes.values())}; raise max_ratio"
        )
    return best[2], best[1]


def geometry_for_spec(
    spec: ModelSpec,
    *,
    tokens_per_page: int = 1,
    alignment: int = DEFAULT_ALIGNMENT,
    max_ratio: int = DEFAULT_MAX_RATIO,
) -> PoolGeometry:
    """Page types of `spec`: KV[group index] per attention group, STATE[group index] for Mamba.

    Group indices are positions in `spec.groups` (the `PageType.group` contract).
    """
    if tokens_per_page <= 0:
        raise ValueError(f"tokens_per_page must be positive, got {tokens_per_page}")
    sizes: dict[PageType, int] = {}
    data: dict[PageType, int] = {}
    for index, group in enumerate(spec.groups):
        if isinstance(group, MambaGroup):
            t = PageType(PageKind.STATE, index)
            sizes[t] = state_layout(group, alignment).size
            data[t] = group.state_bytes
        elif isinstance(group, AttentionGroup):
            t = PageType(PageKind.KV, index)
            sizes[t] = data[t] = tokens_per_page * group.kv_bytes_per_token
    if not sizes:
        raise ValueError(f"model spec {spec.name!r} has no attention or Mamba groups to cache")
    return compute_geometry(
        sizes,
        data_bytes=data,
        alignment=alignment,
        max_ratio=max_ratio,
        tokens_per_page=tokens_per_page,
    )
