"""Page sizes of the Jenga pool: LCM large pages, state alignment, granule padding."""

from __future__ import annotations

import math

import pytest

from jenga_sglang.models.spec import AttentionGroup, DType, MambaGroup, MlpGroup, ModelSpec
from jenga_sglang.pool.sizing import (
    compute_geometry,
    geometry_for_spec,
    round_up,
    state_layout,
)
from jenga_sglang.radix.pages import PageKind, PageType

IMG = PageType(PageKind.KV, 0)
TXT = PageType(PageKind.KV, 1)


def _attn(name: str, layers: int, heads: int = 2, head_dim: int = 8) -> AttentionGroup:
    return AttentionGroup(name, layers, heads, head_dim, DType.BF16, 1.0, 1.0)


def _mamba(layers: int = 3) -> MambaGroup:
    return MambaGroup("ssm", layers, (24, 3), DType.BF16, (4, 8, 16), DType.FP32, 1.0)


def test_figure6_lcm_of_256_and_384() -> None:
    geo = compute_geometry({IMG: 256, TXT: 384})
    assert geo.large_page_bytes == 768
    assert (geo.of(IMG).per_large, geo.of(TXT).per_large) == (3, 2)
    assert geo.granule == 1
    assert all(tg.padding_bytes == 0 for tg in geo.types)


def test_spec_types_follow_group_indices_and_sizes() -> None:
    spec = ModelSpec(
        "hand",
        (_attn("full", 2), MlpGroup("mlp", 4, 1.0), _mamba(3), _attn("swa", 1)),
        hidden_size=64,
    )
    geo = geometry_for_spec(spec, tokens_per_page=4, alignment=256)
    kinds = {t: (t.kind, t.group) for t in geo.page_types}
    assert set(kinds.values()) == {(PageKind.KV, 0), (PageKind.STATE, 2), (PageKind.KV, 3)}
    full = geo.of(PageType(PageKind.KV, 0))
    assert full.data_bytes == 4 * spec.groups[0].kv_bytes_per_token  # type: ignore[union-attr]
    state = geo.of(PageType(PageKind.STATE, 2))
    group = _mamba(3)
    assert state.data_bytes == group.state_bytes
    layout = state_layout(group, 256)
    # conv (144 B) and temporal (2048 B) each start on a 256-byte boundary
    assert (layout.conv_stride, layout.temporal_stride) == (256, 2048)
    assert layout.size == 3 * (256 + 2048)
    sizes = [tg.page_bytes for tg in geo.types]
    assert geo.large_page_bytes % math.lcm(*sizes) == 0
    for tg in geo.types:
        assert tg.per_large * tg.page_bytes == geo.large_page_bytes


def test_exact_lcm_within_bound_is_kept() -> None:
    a, b = PageType(PageKind.KV, 0), PageType(PageKind.STATE, 1)
    geo = compute_geometry({a: 1000, b: 1100}, max_ratio=64)  # lcm 11000 <= 64 * 1100
    assert geo.large_page_bytes == 11000 == geo.exact_lcm


def test_padding_when_lcm_exceeds_bound() -> None:
    a, b = PageType(PageKind.KV, 0), PageType(PageKind.STATE, 1)
    sizes = {a: 1000 * 2, b: 104_729 * 2}  # 104729 is prime: exact LCM = 209_458_000
    geo = compute_geometry(sizes, alignment=16, max_ratio=8)
    bound = 8 * max(sizes.values())
    assert geo.exact_lcm == math.lcm(*sizes.values()) > bound
    assert geo.large_page_bytes <= bound
    assert geo.granule > 1 and geo.granule % 16 == 0
    for tg in geo.types:
        assert tg.page_bytes == round_up(sizes[tg.ptype], geo.granule)
        assert tg.padding_bytes == tg.page_bytes - sizes[tg.ptype]
        assert tg.padding_percent == pytest.approx(100 * tg.padding_bytes / tg.page_bytes)
        assert tg.per_large * tg.page_bytes == geo.large_page_bytes
    # padding stays modest: well under a granule's share of the larger page
    assert geo.of(b).padding_percent < 5.0


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="positive"):
        compute_geometry({IMG: 0})
    with pytest.raises(ValueError, match="at least one"):
        compute_geometry({})
    with pytest.raises(ValueError, match="tokens_per_page"):
        geometry_for_spec(ModelSpec("m", (_attn("a", 1),), 8), tokens_per_page=0)
    with pytest.raises(KeyError, match="not in this geometry"):
        compute_geometry({IMG: 256}).of(TXT)
