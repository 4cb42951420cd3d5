"""The Jenga pool behind a hybrid-SWA model's KV pools (gpt-oss), from the configurator's sizes.

SGLang's `_init_pools` builds a full KV pool and a sliding-window KV pool of a static ratio
(`--swa-full-tokens-ratio`) and an `SWATokenToKVPoolAllocator` over them. With `--enable-jenga`
(and `--jenga-pool`, on by default) binding/pools/hook.py calls `build` here instead: the same
bytes as one Jenga pool carved into full or window KV pages on demand
(binding/pools/build.py `build_jenga_swa_pools`), behind SGLang's own SWA pool and allocator
classes, and SGLang's own request rows.
"""

from __future__ import annotations

import logging
from typing import Any

from jenga_sglang.binding.options import check_pool_attention, pool_wanted
from jenga_sglang.binding.pools.build import (
    JengaSWAPools,
    KVShape,
    PoolBuildError,
    build_jenga_swa_pools,
    swa_storage_spec,
)
from jenga_sglang.binding.refusals import pool_refuses_speculation

logger = logging.getLogger(__name__)


def wanted(configurator: Any, req_to_token_pool: Any) -> bool:
    """A hybrid-SWA target model without SSM layers, under --enable-jenga --jenga-pool."""
    return (
        pool_wanted(configurator, req_to_token_pool)
        and bool(configurator.is_hybrid_swa)
        and configurator.mambaish_config is None
    )


def _check_supported(configurator: Any) -> None:
    from sglang.srt.runtime_context import attention_backends, get_disagg, get_spec

    check_pool_attention(*attention_backends())  # SGLang's resolved (prefill, decode) pair
    problems = []
    if get_disagg().disaggregation_mode != "null":  # only Mamba pools register page regions
        problems.append("prefill-decode disaggregation")
    algorithm = get_spec().speculative_algorithm
    if pool_refuses_speculation(algorithm, draft_in_pool=False):
        problems.append(f"speculative decoding with a draft model ({algorithm})")
    if getattr(configurator, "is_hybrid_swa_compress", False):
        problems.append("window layers of another head shape")
    if configurator.use_mla_backend:
        problems.append("MLA attention")
    if problems:
        raise PoolBuildError(
            f"--jenga-pool does not support {', '.join(problems)} on a sliding-window model "
            "yet; pass --no-jenga-pool to keep SGLang's SWA pools"
        )


def build(configurator: Any, sizes: Any) -> JengaSWAPools:
    """Our pools for the bytes SGLang's static split would take (full + window tokens)."""
    from sglang.srt.runtime_context import get_parallel, get_schedule

    _check_supported(configurator)
    layer = configurator.layer_info
    model = configurator.model_config
    parallel = get_parallel()

    def shape(layer_ids: Any) -> KVShape:
        return KVShape(
            layer_ids=tuple(i for i in layer_ids if layer.start_layer <= i < layer.end_layer),
            head_num=model.get_num_kv_heads(parallel.attn_tp_size, parallel.attn_dcp_size),
            head_dim=model.head_dim,
            dtype=configurator.kv_cache_dtype,
        )

    full, window = shape(layer.full_attention_layer_ids), shape(layer.swa_attention_layer_ids)
    spec = swa_storage_spec(full, window)
    full_bytes, window_bytes = (g.kv_bytes_per_token for g in spec.attention_groups)
    budget = (sizes.full_max_total_num_tokens + 1) * full_bytes + (
        sizes.swa_max_total_num_tokens + 1
    ) * window_bytes
    req_pool = configurator._build_req_to_token_pool(max_num_reqs=sizes.max_running_requests)
    pools = build_jenga_swa_pools(
        full=full,
        window=window,
        budget_bytes=budget,
        device=configurator.device,
        req_to_token_pool=req_pool,
        page_size=get_schedule().page_size,
    )
    geometry = pools.layout.geometry
    logger.info(
        "Jenga pool (sliding window): %d bytes, %d large pages of %d bytes (full KV page %d B "
        "x %d, window KV page %d B x %d); the static split's %d full + %d window tokens; "
        "%d token pairs free",
        pools.layout.buffer.numel(),
        pools.paired.pool.num_large,
        geometry.large_page_bytes,
        *(x for tg in geometry.types for x in (tg.page_bytes, tg.per_large)),
        sizes.full_max_total_num_tokens,
        sizes.swa_max_total_num_tokens,
        pools.paired.pairs(),
    )
    return pools
