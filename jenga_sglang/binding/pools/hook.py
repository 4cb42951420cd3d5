"""Hooks on SGLang's KV cache configurator that put the Jenga pool behind its pools.

SGLang 0.5.23 has no registry for memory pools; `KVCacheConfigurator._init_pools` is the one
method that builds the request pool, the KV pool and the KV allocator from the sizes SGLang
resolved. The plugin registers (HookRegistry, docs/sglang.md "The Jenga pool behind SGLang's
pools"):

* AROUND `_init_pools`: with `--enable-jenga --jenga-pool`, a hybrid Mamba model with at least
  one attention layer and the target worker, build ours (binding/pools/build.py) over the static
  split's byte budget (under tensor parallelism the smallest rank's, and the built pools must
  be equal on every rank: binding/cache/tp_consensus.py) and return SGLang's own
  `_InitializedPools` record (on a PD decode worker with SGLang's decode request pool, rows
  for pre-allocated requests included: binding/pools/decode_pool.py); a hybrid-SWA model gets
  its full and window KV from one Jenga pool (binding/pools/swa_hook.py); anything else goes
  to the original; a draft worker of such a target gets the draft's views of the same KV
  pages (binding/pools/draft.py); either way a draft worker's KV pool is noted for the host
  tier's copies;
* AFTER `configure`: `max_total_num_tokens` becomes the most KV tokens our pool can hold (the
  scheduler clips requests by it; SGLang computed the static split's KV share).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

from jenga_sglang.binding.options import check_pool_attention, pool_wanted
from jenga_sglang.binding.pools import draft as draft_pool
from jenga_sglang.binding.pools import swa_hook as swa_pool_hook
from jenga_sglang.binding.pools import transfer
from jenga_sglang.binding.pools.allocator import JengaKVAllocator
from jenga_sglang.binding.pools.build import (
    KVShape,
    PoolBuildError,
    build_jenga_pools,
    static_split_bytes,
    storage_spec,
)
from jenga_sglang.binding.pools.sglang_pool import JengaHybridReqToTokenPool, JengaMambaRows
from jenga_sglang.binding.pools.swa_allocator import JengaSWAAllocator
from jenga_sglang.binding.refusals import pool_refuses_speculation

CONFIGURATOR = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"
logger = logging.getLogger(__name__)


def _wanted(configurator: Any, req_to_token_pool: Any) -> bool:
    return (
        pool_wanted(configurator, req_to_token_pool)
        and configurator.mambaish_config is not None
        # No attention layer (pure Mamba2): no KV to share a buffer with; SGLang's pools.
        and bool(getattr(configurator.mambaish_config, "full_attention_layer_ids", None))
    )


def around_init_pools(original: Callable[..., Any], configurator: Any, **kwargs: Any) -> Any:
    from sglang.srt.mem_cache.kv_cache_configurator import _InitializedPools

    allocator = kwargs.get("token_to_kv_pool_allocator")
    if draft_pool.wanted(configurator, allocator):
        draft = draft_pool.draft_kv_pool(configurator, allocator)
        draft_pool.remember_draft_pool(allocator, draft)
        return _InitializedPools(
            req_to_token_pool=kwargs["req_to_token_pool"],  # the target's, as SGLang shares it
            token_to_kv_pool=draft,
            token_to_kv_pool_allocator=allocator,
        )
    if swa_pool_hook.wanted(configurator, kwargs.get("req_to_token_pool")):
        built = swa_pool_hook.build(configurator, kwargs["sizes"])
        return _InitializedPools(
            req_to_token_pool=built.req_to_token_pool,
            token_to_kv_pool=built.token_to_kv_pool,
            token_to_kv_pool_allocator=built.token_to_kv_pool_allocator,
        )
    if not _wanted(configurator, kwargs.get("req_to_token_pool")):
        built = original(configurator, **kwargs)
        if configurator.is_draft_worker:
            draft_pool.remember_draft_pool(allocator, built.token_to_kv_pool)
        return built

    from jenga_sglang.binding.cache.tp_consensus import check_pool_agreed

    pools = _build(configurator, kwargs["sizes"])
    geometry, shared = pools.layout.geometry, pools.shared
    check_pool_agreed(shared)  # TP ranks: equal pools or a start-up error
    logger.info(
        "Jenga pool: %d bytes, %d large pages of %d bytes (KV page %d B x %d, state page %d B x "
        "%d), state reserve %d, KV tokens %d, states %d",
        pools.layout.buffer.numel(),
        shared.pool.num_large,
        geometry.large_page_bytes,
        *(x for tg in geometry.types for x in (tg.page_bytes, tg.per_large)),
        shared.state_reserve,
        shared.room(shared.kv_type),
        shared.room(shared.state_type),
    )
    return _InitializedPools(
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool=pools.token_to_kv_pool,
        token_to_kv_pool_allocator=pools.token_to_kv_pool_allocator,
    )


def after_configure(result: Any, configurator: Any, *a: Any, **k: Any) -> Any:
    import msgspec

    allocator = result.token_to_kv_pool_allocator
    if isinstance(allocator, JengaSWAAllocator):
        # One request may hold at most what its full KV can take beside its window (and a
        # page): SGLang's figure unless the pool gives less (requests are clipped by it). The
        # chunk a request prefills is sized by the scheduler from what is free at the time.
        window = int(configurator.model_config.sliding_window_size or 0)
        page = int(allocator.page_size)
        fits = allocator.paired.most_full(-(-window // page) + 1) * page
        most = min(int(result.max_total_num_tokens), fits)
        if most < 1:
            raise PoolBuildError(
                f"the Jenga pool of {allocator.paired.pool.capacity_bytes} bytes holds no "
                f"request beside a window of {window} tokens; give SGLang more KV memory"
            )
        return msgspec.structs.replace(
            result,
            max_total_num_tokens=most,
            full_max_total_num_tokens=int(allocator.size_full),
            swa_max_total_num_tokens=int(allocator.size_swa),
        )
    if not isinstance(allocator, JengaKVAllocator):
        return None  # keep SGLang's result
    return msgspec.structs.replace(result, max_total_num_tokens=int(allocator.size))


def _check_supported(configurator: Any) -> None:
    from sglang.srt.runtime_context import attention_backends, get_exec, get_spec

    check_pool_attention(*attention_backends())  # SGLang's resolved (prefill, decode) pair
    problems = []
    if configurator.is_hybrid_swa or configurator.use_mla_backend:
        problems.append("sliding-window or MLA attention")
    algorithm = get_spec().speculative_algorithm
    if pool_refuses_speculation(algorithm, draft_in_pool=True):
        problems.append(f"speculative decoding with {algorithm}")
    mamba = get_exec().mamba
    if mamba.enable_linear_replayssm or mamba.enable_linear_replayssm_spec:
        problems.append("--enable-linear-replayssm")
    if configurator.model_config.v_head_dim != configurator.model_config.head_dim:
        problems.append("K and V of different head dims")
    if problems:
        raise PoolBuildError(f"--jenga-pool does not support {', '.join(problems)} yet")


def _build(configurator: Any, sizes: Any) -> Any:
    from sglang.srt.runtime_context import get_disagg, get_parallel, get_schedule

    from jenga_sglang.binding.cache.tp_consensus import agree_pool_budget

    _check_supported(configurator)
    if get_disagg().disaggregation_mode != "null":
        transfer.install()  # the re-slice guard on this PD worker's transfers
    layer = configurator.layer_info
    config = configurator.mambaish_config
    parallel, schedule = get_parallel(), get_schedule()
    kv = KVShape(
        layer_ids=tuple(
            i for i in config.full_attention_layer_ids if layer.start_layer <= i < layer.end_layer
        ),
        head_num=configurator.model_config.get_num_kv_heads(
            parallel.attn_tp_size, parallel.attn_dcp_size
        ),
        head_dim=configurator.model_config.head_dim,
        dtype=configurator.kv_cache_dtype,
    )
    kv = dataclasses.replace(kv, draft_layers=draft_pool.draft_layers(configurator, kv))
    cache_params = config.mamba2_cache_params
    spec = storage_spec(kv, cache_params)
    rows = _request_rows(configurator, sizes.max_running_requests)
    return build_jenga_pools(
        kv=kv,
        cache_params=cache_params,
        mamba_layer_ids=configurator._get_mamba_layer_ids_for_req_pool(),
        budget_bytes=agree_pool_budget(  # the smallest rank's: equal pools on every TP rank
            static_split_bytes(spec, sizes.max_total_num_tokens, schedule.max_mamba_cache_size)
        ),
        state_reserve=rows.state_reserve,
        device=configurator.device,
        req_pool_kwargs=rows.kwargs,
        page_size=schedule.page_size,
        checkpoint_base=int(schedule.max_mamba_cache_size or sizes.max_running_requests),
        req_pool_class=rows.pool_class,
    )


class _RequestRows(NamedTuple):
    """The request pool to build, its arguments, and the states its requests may hold."""

    pool_class: type[JengaMambaRows]
    kwargs: dict[str, Any]
    state_reserve: int


def _request_rows(configurator: Any, running: int) -> _RequestRows:
    """SGLang's request pool for this worker over our Mamba pool: on a PD decode worker, the
    decode pool with rows for requests pre-allocated while their KV and state arrive."""
    from sglang.srt.mem_cache.allocation_sizing import (
        get_mamba_tracking_slots,
        get_req_to_token_extra_context_len,
    )
    from sglang.srt.runtime_context import (
        get_disagg,
        get_exec,
        get_schedule,
        get_spec,
        max_speculative_num_draft_tokens,
    )

    mamba, overlap = get_exec().mamba, not get_schedule().disable_overlap_schedule
    kwargs: dict[str, Any] = {
        "size": running,
        "max_context_len": configurator.model_config.context_len
        + get_req_to_token_extra_context_len(),
        "enable_mamba_extra_buffer": mamba.enable_mamba_extra_buffer,
        "enable_overlap_schedule": overlap,
        "start_layer": configurator.layer_info.start_layer,
        "speculative_num_draft_tokens": max_speculative_num_draft_tokens(),
        "speculative_eagle_topk": get_spec().speculative_eagle_topk,
    }
    disagg = get_disagg()
    decode = disagg.disaggregation_mode == "decode"
    tracking = get_mamba_tracking_slots(
        extra_buffer=mamba.enable_mamba_extra_buffer,
        overlap=overlap,
        lazy=mamba.enable_mamba_extra_buffer_lazy and not decode,  # as SGLang's decode pool
    )
    if not decode:
        kwargs["mamba_spec_state_size"] = running
        kwargs["enable_mamba_extra_buffer_lazy"] = mamba.enable_mamba_extra_buffer_lazy
        return _RequestRows(JengaHybridReqToTokenPool, kwargs, running * (1 + tracking))
    from jenga_sglang.binding.pools.decode_pool import JengaHybridMambaDecodeReqToTokenPool

    kwargs["pre_alloc_size"] = extra = int(disagg.disaggregation_decode_extra_slots or 0)
    return _RequestRows(
        JengaHybridMambaDecodeReqToTokenPool, kwargs, (running + extra) * (1 + tracking)
    )
