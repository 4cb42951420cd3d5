"""Model specs: what a hybrid model's cache holds and what prefilling it costs.

A `ModelSpec` is an ordered tuple of layer groups. Each group is a set of layers of one kind
that share a cache rule and a page type:

    AttentionGroup(window=None)  full attention: KV for every token
    AttentionGroup(window=w)     sliding window: KV for the last w tokens suffices
    MambaGroup                   SSM: one constant-size state (conv + temporal) per layer
    MlpGroup                     stateless: costs FLOPs, holds nothing

FLOPs follow one closed form per group so that "FLOPs saved by tokens [a, b)" is exact:

    prefill_flops(a, b) = F(b) - F(a),   F(l) = linear * l + quadratic(l)

where quadratic(l) is the attention score/value term, counted over the tokens each query attends
to (all previous tokens for full attention, at most `window` for sliding window). A prefix hit of
length p saves exactly F(p); a radix node covering [a, b) saves F(b) - F(a) relative to its parent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum


def _check_positive(group: str, **values: int) -> None:
    for field_name, value in values.items():
        if value < 1:
            raise ValueError(f"group {group!r}: {field_name} must be >= 1, got {value}")


class DType(Enum):
    """Element types of cached tensors, with their width in bytes."""

    INT8 = ("int8", 1)
    FP8 = ("float8", 1)
    BF16 = ("bfloat16", 2)
    FP16 = ("float16", 2)
    FP32 = ("float32", 4)

    def __init__(self, torch_name: str, nbytes: int) -> None:
        self.torch_name = torch_name
        self.nbytes = nbytes

    @classmethod
    def parse(cls, name: str) -> DType:
        aliases = {
            "bf16": "bfloat16",
            "fp16": "float16",
            "half": "float16",
            "fp32": "float32",
            "float": "float32",
            "fp8": "float8",
            "float8_e4m3fn": "float8",
        }
        name = aliases.get(name, name)
        for member in cls:
            if member.torch_name == name:
                return member
        raise ValueError(f"unknown dtype {name!r}; expected one of {[m.torch_name for m in cls]}")


@dataclass(frozen=True)
class AttentionGroup:
    """`num_layers` attention layers with the same KV shape and window.

    `linear_flops_per_token` and `score_flops_per_pair` are per layer. The score term counts
    query-key pairs: a query at position i attends to min(i, window) earlier tokens plus itself
    (causal), so F_score(l) = score_flops_per_pair * sum_{i<l} min(i + 1, window).
    """

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: DType
    linear_flops_per_token: float
    score_flops_per_pair: float
    window: int | None = None
    #: Marconi's formula counts l^2 pairs (no causal halving); the marconi-7b preset sets this.
    square_pairs: bool = False

    def __post_init__(self) -> None:
        _check_positive(
            self.name,
            num_layers=self.num_layers,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
        )
        if self.window is not None:
            _check_positive(self.name, window=self.window)

    @property
    def is_sliding(self) -> bool:
        return self.window is not None

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token across every layer of the group."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.nbytes

    def flops(self, length: int) -> float:
        """F(l): FLOPs of every layer of the group to prefill `length` tokens from scratch."""
        return self.num_layers * (
            self.linear_flops_per_token * length + self.score_flops_per_pair * self._pairs(length)
        )

    def _pairs(self, length: int) -> float:
        """(query, key) pairs scored when prefilling `length` tokens (integer-exact)."""
        window = self.window
        if self.square_pairs:
            return float(length * (length if window is None else min(length, window)))
        if window is None or length <= window:
            return float(length * (length + 1) // 2)
        return float(window * (window + 1) // 2 + (length - window) * window)


@dataclass(frozen=True)
class MambaGroup:
    """`num_layers` Mamba (SSM) layers. One state per layer: conv state + temporal (SSM) state.

    Shapes are per layer and per tensor-parallel rank, e.g. conv (conv_dim, K-1) and temporal
    (heads, head_dim, d_state) for Mamba2.
    """

    name: str
    num_layers: int
    conv_shape: tuple[int, ...]
    conv_dtype: DType
    temporal_shape: tuple[int, ...]
    temporal_dtype: DType
    linear_flops_per_token: float
    #: Quantized checkpoints (`int8_checkpoints`): one scale per (head, k-channel), in the
    #: state's own dtype before quantization; () for none.
    temporal_scale_shape: tuple[int, ...] = ()
    temporal_scale_dtype: DType = DType.FP32
    #: The states arrive with each request from a peer (`states_from_peer`: a PD decode
    #: worker gets the prefill side's state beside the KV), so the tree keeps none of them
    #: and every prefix is valid for this group.
    from_peer: bool = False

    def __post_init__(self) -> None:
        _check_positive(self.name, num_layers=self.num_layers)
        for label, shape in (
            ("conv_shape", self.conv_shape),
            ("temporal_shape", self.temporal_shape),
        ):
            if not shape or any(n < 0 for n in shape):
                raise ValueError(f"group {self.name!r}: bad {label} {shape}")

    @property
    def conv_bytes(self) -> int:
        """Conv state bytes of one layer."""
        return math.prod(self.conv_shape) * self.conv_dtype.nbytes

    @property
    def temporal_bytes(self) -> int:
        """Temporal (SSM) state bytes of one layer (with its scales, when quantized)."""
        scales = self.temporal_scale_dtype.nbytes * math.prod(self.temporal_scale_shape)
        return math.prod(self.temporal_shape) * self.temporal_dtype.nbytes + (
            scales if self.temporal_scale_shape else 0
        )

    @property
    def state_bytes(self) -> int:
        """One checkpoint: conv + temporal state of every layer of the group."""
        return self.num_layers * (self.conv_bytes + self.temporal_bytes)

    def flops(self, length: int) -> float:
        return self.num_layers * self.linear_flops_per_token * length


@dataclass(frozen=True)
class MlpGroup:
    """Stateless layers (dense MLP or MoE): FLOPs only."""

    name: str
    num_layers: int
    linear_flops_per_token: float

    def __post_init__(self) -> None:
        _check_positive(self.name, num_layers=self.num_layers)

    def flops(self, length: int) -> float:
        return self.num_layers * self.linear_flops_per_token * length


LayerGroup = AttentionGroup | MambaGroup | MlpGroup


@dataclass(frozen=True)
class ModelSpec:
    """An ordered set of layer groups plus the facts the cache needs about them."""

    name: str
    groups: tuple[LayerGroup, ...]
    hidden_size: int
    #: Where the numbers came from (HF architecture, preset formula...), for reports.
    source: str = ""
    extra: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError(f"model spec {self.name!r} has no layer groups")
        mambas = self.mamba_groups
        if len(mambas) > 1:
            raise ValueError(f"model spec {self.name!r}: at most one Mamba group is supported")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"model spec {self.name!r}: duplicate group names {names}")

    @property
    def attention_groups(self) -> tuple[AttentionGroup, ...]:
        return tuple(g for g in self.groups if isinstance(g, AttentionGroup))

    @property
    def mamba_groups(self) -> tuple[MambaGroup, ...]:
        return tuple(g for g in self.groups if isinstance(g, MambaGroup))

    @property
    def has_mamba(self) -> bool:
        return bool(self.mamba_groups)

    @property
    def keeps_states(self) -> bool:
        """Whether the tree holds SSM checkpoints: a Mamba group whose states no peer sends."""
        return any(not g.from_peer for g in self.mamba_groups)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token across every attention group."""
        return sum(g.kv_bytes_per_token for g in self.attention_groups)

    @property
    def state_bytes(self) -> int:
        """Bytes of one SSM checkpoint (0 for models without Mamba layers)."""
        return sum(g.state_bytes for g in self.mamba_groups)

    def flops(self, length: int) -> float:
        """F(l): FLOPs to prefill `length` tokens from scratch."""
        return sum(g.flops(length) for g in self.groups)

    def prefill_flops(self, start: int, end: int) -> float:
        """FLOPs to prefill tokens [start, end) given a cached prefix of `start` tokens."""
        if not 0 <= start <= end:
            raise ValueError(f"bad token range [{start}, {end})")
        return self.flops(end) - self.flops(start)


def int8_checkpoints(spec: ModelSpec) -> ModelSpec:
    """`spec` with its SSM checkpoints stored as SGLang's `--enable-int8-mamba-checkpoint`
    stores them (mem_cache/mamba_checkpoint_pool.py): the temporal state in int8 with one scale
    per (layer, head, k-channel), in the state's own dtype, reducing over d_v; the conv state
    as it was. That applies to states laid out (heads, d_v, d_k): Mamba2's and the linear
    attentions'. A Mamba-1 state (channels, d_state) has no such axis, and SGLang does not
    quantize it; that raises ValueError, as does a spec without Mamba layers."""
    if not spec.has_mamba:
        raise ValueError(f"model spec {spec.name!r} has no SSM checkpoints to quantize")
    groups: list[LayerGroup] = []
    for g in spec.groups:
        if isinstance(g, MambaGroup):
            if len(g.temporal_shape) != 3 or g.temporal_scale_shape:
                raise ValueError(
                    f"group {g.name!r}: int8 checkpoints need a (heads, d_v, d_k) state, got "
                    f"{g.temporal_shape}{' (quantized already)' if g.temporal_scale_shape else ''}"
                )
            heads, _, d_k = g.temporal_shape
            g = replace(g, temporal_dtype=DType.INT8, temporal_scale_shape=(heads, 1, d_k),
                        temporal_scale_dtype=g.temporal_dtype)  # fmt: skip
        groups.append(g)
    return replace(spec, groups=tuple(groups), source=f"{spec.source}; int8 checkpoints")


def states_from_peer(spec: ModelSpec) -> ModelSpec:
    """`spec` on a prefill-decode disaggregation decode worker with a radix cache of its own
    (SGLang's `--disaggregation-decode-enable-radix-cache`): every request's SSM state arrives
    from the prefill worker with its KV suffix, so a decode-side hit needs the KV alone and the
    tree keeps no checkpoints (`MambaGroup.from_peer`). The pools still hold each running
    request's state: the groups keep their shapes. ValueError for a spec without Mamba layers
    (there the decode tree is a plain KV tree already)."""
    if not spec.has_mamba:
        raise ValueError(f"model spec {spec.name!r} has no SSM states to take from a peer")
    groups = tuple(
        replace(g, from_peer=True) if isinstance(g, MambaGroup) else g for g in spec.groups
    )
    return replace(spec, groups=groups, source=f"{spec.source}; states from the prefill peer")
