"""SGLang 0.5.23's request/KV/Mamba pools for one byte budget, built on device="cpu".

Two layouts, both sized by `SglangSplit` (bench/drivers/sglang_split.py):

* `static_pools`: the default static split. `HybridReqToTokenPool` (request rows + a Mamba
  pool of `split.mamba_slots` slots), `HybridLinearKVPool` and `TokenToKVPoolAllocator` of
  `split.kv_tokens` slots. Per-slot tensors are tiny (one KV head of width one, a few Mamba
  channels): the cache's decisions depend only on slot counts, so the budget is held in
  slots without allocating its bytes.
* `unified_pools`: `--enable-unified-memory`. SGLang's `init_unified_mamba_pools` over one real
  uint8 buffer of the whole budget (2 GB at 2 GB): KV grows from one end, Mamba states from
  the other, and compaction moves data, so per-slot bytes must be the model's. The spec's KV
  bytes per token map onto an MHA pool (`_kv_heads`: heads x head_dim so that 2 x layers x
  heads x head_dim x 2 bytes = the spec's bytes per token) and its state onto a Mamba2 state
  shape (`_mamba2_shape`: conv (conv_dim, kernel - 1) and temporal (heads, head_dim, state)
  equal to the spec's shapes and dtypes). As SGLang does, the token side gets the budget minus
  the static split's Mamba slots, and the Mamba side may then grow to the whole buffer.
  Compaction's byte copies, page zeroing and state copy-on-write are skipped (`_skip_*`):
  nothing reads the contents here. The copies are counted (bench/drivers/sglang_buffer.py: pages and
  bytes compaction would have moved). The buffer itself is reserved address space and its
  start-up zeroing is skipped (`sglang_buffer.unpaged_buffers`): SGLang's `torch.empty` +
  `zero_()` paged the whole budget in (2.8 GB RSS after building a 2 GB pool) and a 54 GB
  allocation failed outright on a 24 GB machine.

Both need `_server_args()` first (SGLang's global ServerArgs). Importing sglang takes 15-27 s:
callers import this module only when they build an SGLang cache.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from sglang.kernels.ops.attention.fla.chunk_delta_h import CHUNK_SIZE
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
from sglang.srt.environ import envs
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

from jenga_sglang.bench.drivers.sglang_buffer import forget, record_copy, unpaged_buffers
from jenga_sglang.bench.drivers.sglang_split import SglangSplit
from jenga_sglang.models.spec import MambaGroup, ModelSpec

MAX_RUNNING = 1  # sequential replay: one request at a time
BUFFER_ALIGN = 4096  # SGLang floors the unified buffer to 4 KiB
_TINY_MAMBA = {
    "intermediate_size": 16,
    "n_groups": 1,
    "num_heads": 1,
    "head_dim": 16,
    "state_size": 1,
    "conv_kernel": 2,
}


class Pools(NamedTuple):
    req_to_token_pool: Any
    allocator: Any
    kv_capacity: int  # the most KV tokens one request can hold


def server_args(unified: bool, extra_buffer: bool = True) -> None:
    """Set SGLang's global ServerArgs: page size 1, the Mamba strategy, defaults otherwise
    (no_buffer turns the overlap scheduler off, as SGLang's `auto` resolution does)."""
    args = ServerArgs(
        model_path="dummy",
        page_size=1,
        mamba_radix_cache_strategy="extra_buffer" if extra_buffer else "no_buffer",
        disable_overlap_schedule=not extra_buffer,
        enable_unified_memory=unified,
    )
    args._mamba_cache_chunk_size = CHUNK_SIZE  # no HF config to read it from
    set_global_server_args_for_scheduler(args)


def layer_ids(spec: ModelSpec) -> tuple[list[int], list[int]]:
    """(full-attention layer ids, Mamba layer ids): attention groups first, then Mamba."""
    n_full = sum(g.num_layers for g in spec.attention_groups)
    n_mamba = sum(g.num_layers for g in spec.mamba_groups)
    return list(range(n_full)), list(range(n_full, n_full + n_mamba))


def _one_mamba_group(spec: ModelSpec) -> MambaGroup:
    if len(spec.mamba_groups) != 1:
        raise ValueError(
            f"SGLang's Mamba pool needs one Mamba group, {spec.name!r} has {len(spec.mamba_groups)}"
        )
    return spec.mamba_groups[0]


def _mamba_params(spec: ModelSpec, mamba: list[int], real: bool) -> Any:
    group = _one_mamba_group(spec)
    dtype = group.temporal_dtype.torch_name if real else "bfloat16"
    with envs.SGLANG_MAMBA_SSM_DTYPE.override(dtype):
        shape_args = _mamba2_shape(group) if real else _TINY_MAMBA
        shape = Mamba2StateShape.create(tp_world_size=1, **shape_args)
        return Mamba2CacheParams(shape=shape, layers=mamba)


def _mamba2_shape(group: MambaGroup) -> dict[str, int]:
    """Mamba2StateShape.create arguments whose conv and temporal shapes are the spec's."""
    conv_dim, conv_width = group.conv_shape
    temporal = group.temporal_shape
    heads, head_dim, state = (1, *temporal) if len(temporal) == 2 else temporal
    inner = heads * head_dim
    groups, rest = divmod(conv_dim - inner, 2 * state)
    if rest or groups < 1 or group.conv_dtype.nbytes != 2:
        raise ValueError(
            f"Mamba group {group.name!r}: conv {group.conv_shape} / temporal {temporal} "
            "is not a Mamba2 state shape with a 16-bit conv state"
        )
    return {
        "intermediate_size": inner,
        "n_groups": groups,
        "num_heads": heads,
        "head_dim": head_dim,
        "state_size": state,
        "conv_kernel": conv_width + 1,
    }


def _kv_heads(spec: ModelSpec) -> tuple[int, int]:
    """(heads, head_dim) of a bf16 MHA pool whose bytes per token equal the spec's."""
    per_layer, rest = divmod(spec.kv_bytes_per_token, len(layer_ids(spec)[0]) * 2 * 2)
    if rest:
        raise ValueError(f"{spec.name!r}: KV bytes per token do not split evenly over layers")
    head_dim = 128 if per_layer % 128 == 0 else per_layer
    return per_layer // head_dim, head_dim


def static_pools(
    spec: ModelSpec,
    split: SglangSplit,
    max_context_len: int,
    extra_buffer: bool = True,
    max_running: int = MAX_RUNNING,
) -> Pools:
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool

    full, mamba = layer_ids(spec)
    req_pool = HybridReqToTokenPool(
        size=max_running + 1,
        mamba_size=split.mamba_slots,
        mamba_spec_state_size=max_running + 1,
        max_context_len=max_context_len + 1,
        device="cpu",
        enable_memory_saver=False,
        cache_params=_mamba_params(spec, mamba, real=False),
        mamba_layer_ids=mamba,
        enable_mamba_extra_buffer=extra_buffer,
        speculative_num_draft_tokens=3,
    )
    kv_pool = HybridLinearKVPool(
        size=split.kv_tokens,
        dtype=torch.bfloat16,
        page_size=1,
        head_num=1,
        head_dim=1,
        full_attention_layer_ids=full,
        device="cpu",
        enable_memory_saver=False,
        mamba_pool=req_pool.mamba_pool,
    )
    allocator = TokenToKVPoolAllocator(
        size=split.kv_tokens, dtype=torch.bfloat16, device="cpu", kvcache=kv_pool, need_sort=False
    )
    return Pools(req_pool, allocator, split.kv_tokens)


def _skip_byte_copy(
    raw: torch.Tensor, dst_pages: torch.Tensor, src_pages: torch.Tensor, _: int, page_bytes: int
) -> None:
    """Compaction's page copy without the bytes (0.17 s per call on CPU at 2 GB), counted. The
    replay never reads KV or state contents; the allocator's moves and v2p tables still run."""
    if dst_pages.numel() != src_pages.numel():
        raise ValueError(f"page move of {src_pages.numel()} pages into {dst_pages.numel()}")
    record_copy(raw, src_pages.numel(), page_bytes)


def _skip_zeroing(raw: torch.Tensor, pages: torch.Tensor, *_: int) -> None:
    """Zeroing of handed-out pages, skipped for the same reason (0.05 s per call on CPU)."""


def _skip_state_copy(self: Any, src_indices: torch.Tensor, dst_indices: torch.Tensor) -> None:
    """Copy-on-write of a Mamba state without the bytes (26.8 MB a copy for marconi-7b, and it
    would page in the lazily allocated buffer); slot bookkeeping is the caller's, unchanged."""
    if src_indices.numel() != dst_indices.numel():
        raise ValueError(f"state copy of {src_indices.numel()} slots into {dst_indices.numel()}")


def unified_pools(
    spec: ModelSpec,
    split: SglangSplit,
    max_context_len: int,
    extra_buffer: bool = True,
    lazy_compaction: bool = False,
) -> Pools:
    """`lazy_compaction`: SGLang's server default (frees leave holes that an allocation short
    of room compacts); off, every free compacts at once (SGLANG_DISABLE_LAZY_COMPACTION=1)."""
    from sglang.srt.mem_cache import unified_memory_pool

    unified_memory_pool.copy_pages = _skip_byte_copy
    unified_memory_pool.zero_pages = _skip_zeroing
    unified_memory_pool.UnifiedMambaPool.copy_from = _skip_state_copy

    token_bytes = split.budget_bytes - split.mamba_slots * split.state_bytes
    token_bytes -= token_bytes % BUFFER_ALIGN
    with unpaged_buffers(min_bytes=token_bytes):
        bundle = _init_unified(spec, split, max_context_len, extra_buffer, lazy_compaction)
    forget(bundle.unified_memory_pool._raw)  # a new buffer may reuse a released one's address
    allocator = bundle.token_to_kv_pool_allocator
    # One running request keeps three state slots (live + two track slots); the rest is KV.
    kv_capacity = (split.budget_bytes - 4 * split.state_bytes) // split.kv_bytes_per_token
    return Pools(bundle.req_to_token_pool, allocator, min(kv_capacity, allocator.size))


def _init_unified(
    spec: ModelSpec,
    split: SglangSplit,
    max_context_len: int,
    extra_buffer: bool,
    lazy_compaction: bool,
) -> Any:
    from sglang.srt.mem_cache.unified_memory_pool import init_unified_mamba_pools

    full, mamba = layer_ids(spec)
    heads, head_dim = _kv_heads(spec)
    token_bytes = split.budget_bytes - split.mamba_slots * split.state_bytes
    return init_unified_mamba_pools(
        device="cpu",
        kv_cache_dtype=torch.bfloat16,
        head_num=heads,
        head_dim=head_dim,
        page_size=1,
        start_layer=0,
        end_layer=len(full) + len(mamba),
        is_draft_worker=False,
        use_mla_backend=False,
        mamba_layer_ids=mamba,
        full_attention_layer_ids=full,
        mamba2_cache_params=_mamba_params(spec, mamba, real=True),
        model_context_len=max_context_len + 1,
        extra_max_context_len=0,
        max_total_num_tokens=split.kv_tokens,
        max_mamba_cache_size=split.mamba_slots,
        max_num_reqs=MAX_RUNNING + 1,
        enable_memory_saver=False,
        enable_mamba_extra_buffer=extra_buffer,
        enable_mamba_extra_buffer_lazy=False,
        speculative_num_draft_tokens=None,
        disable_overlap_schedule=not extra_buffer,
        need_sort=False,
        lazy_compaction=lazy_compaction,
        unified_total_bytes=token_bytes - token_bytes % BUFFER_ALIGN,
    )
