"""SGLang's KV pool, Mamba pool and request pool whose storage is views of one PoolLayout.

* `JengaMHATokenToKVPool(MHATokenToKVPool)`: `_create_buffers` installs the layout's per-layer K
  and V views ([rows, kv_heads, head_dim], row stride = one KV page of every layer) instead of
  allocating, so SGLang's own set_kv_buffer / get_key_buffer / get_value_buffer address our
  buffer. Row 0 is the sink row (layout.py), SGLang's padded-token slot.
* `JengaMambaPool(MambaPool)`: `mamba_cache.conv[0]` / `.temporal` are the layout's stacked
  [layers, rows, ...] state views; SGLang's clear_slots / copy_from / mamba2_layer_cache run on
  them unchanged. It does not call `MambaPool.__init__` (which allocates): it sets the
  attributes that the inherited methods read, the disabled-feature ones included.
* `JengaHybridReqToTokenPool(HybridReqToTokenPool)`: request rows are SGLang's; its Mamba pool and
  Mamba slot allocator (binding/pools/allocator.py) are ours (`JengaMambaRows`, which the PD
  decode side's request pool shares: binding/pools/decode_pool.py). With
  `--enable-int8-mamba-checkpoint` it builds SGLang's int8 `MambaCheckpointPool` for the tree's
  states beside the Jenga buffer, of the size stock SGLang gives it (`checkpoint_base`: stock's
  Mamba pool size, doubled unless `--int8-mamba-ckpt-size` says otherwise), from the same
  headroom outside the KV budget: int8 pages are not a page type of the Jenga pool yet.

Prefill-decode disaggregation: the KV pool and the Mamba pool register one region each, a
whole small page per row, paired between peers by an id of its own (binding/pools/transfer.py);
`JengaHybridLinearKVPool` publishes the KV region's id.

Speculative decoding: the verify forward keeps each draft step's state in per-request scratch
(`SpeculativeState.intermediate_*`, one row per running request, never a cache entry), which
`JengaMambaPool.add_verify_scratch` allocates beside the Jenga buffer, dense (one conv window
per step, SGLang's layout for draft trees). Accepted tokens' KV moves over the views by index
(`move_kv_cache_native`). A draft model's KV layers sit in the same rows as the target's
(`DraftKV`, binding/pools/draft.py). Drafts with states of their own, ReplaySSM rings and
Qwen4-Exp side states are not supported: the hooks refuse those configurations at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from sglang.srt.mem_cache.mamba_checkpoint_pool import maybe_init_int8_mamba_checkpoint_pool
from sglang.srt.mem_cache.memory_pool import (
    HybridLinearKVPool,
    HybridReqToTokenPool,
    MambaPool,
    MHATokenToKVPool,
    move_kv_cache_native,
)
from sglang.srt.utils.torch_memory_saver_adapter import TorchMemorySaverAdapter

from jenga_sglang.binding.pools.allocator import JengaMambaAllocator
from jenga_sglang.binding.pools.transfer import BufInfos, TransferEntry
from jenga_sglang.pool.layout import StateViews


class JengaMHATokenToKVPool(MHATokenToKVPool):  # type: ignore[misc]  # sglang has no types
    """Full-attention KV pool over per-layer token-slot views of the Jenga buffer (a page of
    `page_size` slots is one small page of the pool, token-major: pool/layout.py)."""

    def __init__(
        self,
        *,
        k_views: Sequence[torch.Tensor],
        v_views: Sequence[torch.Tensor],
        dtype: torch.dtype,
        device: str,
        page_size: int = 1,
        start_layer: int | None = None,
        end_layer: int | None = None,
        transfer: TransferEntry | None = None,
    ) -> None:
        rows, heads, head_dim = k_views[0].shape
        self._k_views, self._v_views = list(k_views), list(v_views)
        self.transfer = transfer
        super().__init__(
            size=rows - page_size,  # the first page is the sink
            page_size=page_size,
            dtype=dtype,
            head_num=heads,
            head_dim=head_dim,
            layer_num=len(self._k_views),
            device=device,
            enable_memory_saver=False,
            start_layer=start_layer,
            end_layer=end_layer,
            enable_alt_stream=False,
            enable_kv_cache_copy=False,  # the tiled copy assumes contiguous rows
            kv_cache_layout="page_major",
        )

    def _create_buffers(self) -> None:
        self.k_buffer = self._k_views
        self.v_buffer = self._v_views
        self._init_data_ptrs_and_strides()

    def _clear_buffers(self) -> None:
        pass  # the views belong to the PoolLayout

    def _kv_tokens_per_row(self) -> int:
        return 1

    def _move_kv_cache_impl(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """Speculative decoding's accepted-token move, by index over the views (SGLang's
        native move; its tiled copy assumes contiguous rows)."""
        move_kv_cache_native(self.k_buffer, self.v_buffer, tgt_loc, src_loc)

    def get_contiguous_buf_infos(self) -> BufInfos:
        """The transfer engines' registration: the KV page type's one region."""
        return _registration(self.transfer)

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """Bytes of K and V the views address (not the strided span they cover)."""
        k = sum(v.numel() * v.element_size() for v in self._k_views)
        return k, sum(v.numel() * v.element_size() for v in self._v_views)


class JengaMambaPool(MambaPool):  # type: ignore[misc]  # sglang has no types
    """Mamba state pool over the stacked conv / temporal views of the Jenga buffer."""

    def __init__(
        self,
        *,
        views: StateViews,
        mamba_layer_ids: Sequence[int],
        device: str,
        transfer: TransferEntry | None = None,
    ) -> None:
        layers, rows = views.temporal_stacked.shape[:2]
        if layers != len(mamba_layer_ids):
            raise ValueError(f"{layers} Mamba layers in the views, {len(mamba_layer_ids)} ids")
        self.mamba_layer_ids = list(mamba_layer_ids)
        self.transfer = transfer
        self.size = rows - 1  # row 0 is the sink
        self.device = device
        self.num_mamba_layers = layers
        self.memory_saver_adapter = TorchMemorySaverAdapter.create(enable=False)
        self.enable_custom_mem_pool, self.custom_mem_pool = False, None
        # Features whose buffers MambaPool.__init__ would allocate: off (checked by the hook).
        self.enable_linear_replayssm = self.enable_linear_replayssm_spec = False
        self.linear_replayssm_cache_len = 16
        self.replayssm_spec_fold = self.replayssm_is_kda = False
        self.replayssm_write_pos = self.replayssm_spec_write_pos = None
        self.replayssm_cache_base = self.replayssm_is_flush = None
        self.debug_memory_pool = False
        self.conv_shard_groups = None
        self.conv_slice_axis = 0
        self.mamba_cache = self.State(conv=[views.conv_stacked], temporal=views.temporal_stacked)
        self.mem_usage = self.mamba_cache.mem_usage_bytes() / (1 << 30)

    def get_contiguous_buf_infos(self) -> BufInfos:
        """The transfer engines' registration: the state page type's one region (a state
        page is every layer's conv and temporal state of one slot)."""
        return _registration(self.transfer)

    def get_state_layer_ids(self) -> list[int]:
        return [_entry(self.transfer).layer_id]

    def get_state_dim_per_tensor(self) -> list[int]:
        return []  # no per-tensor slicing: a page is not one tensor (transfer.py)

    def get_state_slice_outer_counts(self) -> list[int]:
        return []

    def get_state_conv_shard_groups(self) -> list[list[int] | None]:
        return []

    def add_verify_scratch(self, requests: int, draft_tokens: int) -> None:
        """Per-draft-step state scratch for `requests` running requests' verify forwards:
        [layers, requests + 1, draft_tokens, *state] per tensor, outside the Jenga buffer."""
        state = self.mamba_cache

        def scratch(live: torch.Tensor) -> torch.Tensor:
            layers, _, *shape = live.shape
            size = (layers, requests + 1, draft_tokens, *shape)
            return torch.zeros(size, dtype=live.dtype, device=live.device)

        self.mamba_cache = self.SpeculativeState(
            conv=state.conv,
            temporal=state.temporal,
            intermediate_ssm=scratch(state.temporal),
            intermediate_conv_window=[scratch(conv) for conv in state.conv],
        )
        self.mem_usage = self.mamba_cache.mem_usage_bytes() / (1 << 30)


class JengaMambaRows:
    """`_init_mamba_pool` over our Mamba pool and Mamba slot allocator, for SGLang's hybrid
    request pools (mixed in before the SGLang class, whose `__init__` it forwards to)."""

    req_to_token: torch.Tensor  # the SGLang class's request rows
    mamba_ping_pong_track_buffer_size: int

    def __init__(
        self,
        *,
        mamba_pool: JengaMambaPool,
        mamba_allocator: JengaMambaAllocator,
        checkpoint_base: int = 0,
        **kwargs: Any,
    ) -> None:
        self._jenga_mamba = (mamba_pool, mamba_allocator)
        self._checkpoint_base = checkpoint_base
        super().__init__(mamba_size=mamba_pool.size, **kwargs)  # type: ignore[call-arg]

    def _init_mamba_pool(self, **kwargs: Any) -> None:
        from sglang.srt.mem_cache.ple_state_pool import NGramPool, ShortConvPool

        self.mamba_pool, self.mamba_allocator = self._jenga_mamba
        draft_tokens = kwargs.get("speculative_num_draft_tokens")
        if draft_tokens:
            self.mamba_pool.add_verify_scratch(kwargs["mamba_spec_state_size"], draft_tokens)
        layer_ids = kwargs["mamba_layer_ids"]
        self.mamba_map = {layer_id: i for i, layer_id in enumerate(layer_ids)}
        # Side states of Qwen4-Exp only; empty (disabled) as on SGLang's unified pool.
        device = kwargs["device"]
        self.short_conv_pool = ShortConvPool(
            size=0, state_shape=None, layer_ids=[], dtype=torch.bfloat16, device=device
        )
        self.ngram_pool = NGramPool(size=0, context_len=0, eos_token_id=0, device=device)
        self.mamba_ckpt_pool = maybe_init_int8_mamba_checkpoint_pool(  # None without the flag
            mamba_size=self._checkpoint_base,
            cache_params=kwargs["cache_params"],
            mamba_layer_ids=layer_ids,
            device=device,
        )
        self.device = device
        rows = self.req_to_token.shape[0]
        self.req_index_to_mamba_index_mapping = torch.zeros(rows, dtype=torch.int32, device=device)
        if kwargs["enable_mamba_extra_buffer"]:
            self.req_index_to_mamba_ping_pong_track_buffer_mapping = torch.zeros(
                (rows, self.mamba_ping_pong_track_buffer_size), dtype=torch.int64, device=device
            )


class JengaHybridReqToTokenPool(JengaMambaRows, HybridReqToTokenPool):  # type: ignore[misc]
    """SGLang's request pool with our Mamba pool and Mamba slot allocator."""


@dataclass(frozen=True)
class DraftKV:
    """A draft model's per-layer K and V views of the KV pages, the rows' layers after the
    target's (binding/pools/draft.py)."""

    k_views: list[torch.Tensor]
    v_views: list[torch.Tensor]
    dtype: torch.dtype
    page_size: int


class JengaHybridLinearKVPool(HybridLinearKVPool):  # type: ignore[misc]  # sglang has no types
    """SGLang's hybrid KV pool around ours; it publishes the KV region's transfer id in place
    of the attention layers' ids (binding/pools/transfer.py), and holds the draft model's
    views of the same pages, if any (`jenga_draft_kv`)."""

    jenga_draft_kv: DraftKV | None = None

    def get_kv_layer_ids(self) -> list[int]:
        return [_entry(self.full_kv_pool.transfer).layer_id]


def _entry(transfer: TransferEntry | None) -> TransferEntry:
    if transfer is None:
        raise RuntimeError("this Jenga pool was built without transfer regions")
    return transfer


def _registration(transfer: TransferEntry | None) -> BufInfos:
    return _entry(transfer).buf_infos()
