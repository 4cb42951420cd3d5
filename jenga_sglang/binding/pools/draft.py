"""A draft model's KV in the target's KV pages (speculative decoding with a draft model).

SGLang runs a draft model (STANDALONE's, EAGLE's head, NEXTN's MTP layer) in a ModelRunner of
its own that shares the target's request pool and KV allocator and builds its own KV pool,
indexed by the target's token slots: the draft writes the KV of a token at the slot of the
target's KV of that token. On the Jenga pool a slot is a row of a KV page, so the draft's layers
join that page: one row holds every target and draft attention layer's K and V of its token.
What the allocator hands out, the tree caches, evicts or moves to host is then the draft's KV
with the target's, and nothing is allocated for slots the pool may never carve into KV (SGLang's
own unified allocator gives a draft a pool over its whole virtual slot space instead). A page
type of its own would need allocating in lockstep with the target's KV, slot for slot: the row
is that lockstep.

SGLang's sizing already charges the draft's layers per KV token (a draft with the target's
per-layer KV shape), so the pool's byte budget is that same figure. Refused at start-up, with
the reason: a draft whose KV heads or head dim differ from the target's (one row layout per
page), a draft with Mamba or sliding-window layers (no state or window page of its own), and a
draft attention backend other than triton (the one of SGLang's draft backends checked on the
pool's strided views).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from jenga_sglang.binding.options import POOL_ATTENTION_BACKENDS
from jenga_sglang.binding.pools.allocator import JengaKVAllocator
from jenga_sglang.binding.pools.build import KVShape, PoolBuildError
from jenga_sglang.binding.pools.sglang_pool import DraftKV, JengaMHATokenToKVPool

logger = logging.getLogger(__name__)

# The draft worker's KV pool as built (ours over the target's rows, or SGLang's own with
# --no-jenga-pool), by the target's KV pool it shares slots with: the draft worker is built
# before the tree, whose host tier copies both (`remembered_draft_pool`).
_DRAFT_POOLS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def draft_layers(configurator: Any, target: KVShape) -> int:
    """KV layers the target worker's pool keeps per token for its draft model (0 without
    one); raises PoolBuildError for a draft whose KV the pages cannot hold."""
    algorithm = configurator.spec_algorithm
    if algorithm.is_none() or not algorithm.has_draft_kv():
        return 0  # no speculation, or NGRAM (no draft model)
    aux = configurator.spec_aux_config
    layers = int(aux.eagle_draft_num_layers or 0)
    draft = aux.draft_model_config
    if layers <= 0 or draft is None:
        raise PoolBuildError(
            f"--jenga-pool cannot size the KV of this {algorithm.name} draft "
            "(SGLang resolved no draft layer count)"
        )
    heads, head_dim = _kv_shape(draft)
    if (heads, head_dim, draft.v_head_dim) != (target.head_num,) + (target.head_dim,) * 2:
        raise PoolBuildError(
            f"--jenga-pool holds a draft model's KV in the target's KV pages, which needs the "
            f"target's KV heads and head dim ({target.head_num} x {target.head_dim}); the draft "
            f"has {heads} x {head_dim} (pass --no-jenga-pool)"
        )
    return layers


def wanted(configurator: Any, allocator: Any) -> bool:
    """A draft worker whose target built the Jenga pool (its allocator is ours)."""
    return bool(configurator.is_draft_worker) and isinstance(allocator, JengaKVAllocator)


def draft_kv_pool(configurator: Any, allocator: Any) -> JengaMHATokenToKVPool:
    """The draft worker's KV pool: SGLang's pool class over the draft views of the target's
    KV pages, its layers numbered as the draft model numbers them."""
    found: DraftKV | None = getattr(allocator.get_kvcache(), "jenga_draft_kv", None)
    layer = configurator.layer_info
    problems = []
    if configurator.mambaish_config is not None:
        problems.append("Mamba or linear-attention layers")
    if configurator.is_hybrid_swa or configurator.is_hybrid_swa_mtp_draft:
        problems.append("sliding-window layers")
    laid = 0 if found is None else len(found.k_views)
    if laid != layer.num_effective_layers:
        problems.append(f"{layer.num_effective_layers} KV layers ({laid} laid out for it)")
    elif found is not None:
        shape, laid_shape = _kv_shape(configurator.model_config), tuple(found.k_views[0].shape[1:])
        if shape != laid_shape:
            problems.append(f"KV heads x head dim {shape} on this rank ({laid_shape} laid out)")
    if problems:
        raise PoolBuildError(
            "--jenga-pool does not hold this draft model's KV in the target's rows: as SGLang "
            f"builds it, it has {', '.join(problems)} (pass --no-jenga-pool)"
        )
    assert found is not None
    _check_draft_attention()
    logger.info("Jenga pool: the draft model's %d KV layers in the target's KV rows", laid)
    return JengaMHATokenToKVPool(
        k_views=found.k_views,
        v_views=found.v_views,
        dtype=found.dtype,
        device=configurator.device,
        page_size=found.page_size,
        start_layer=layer.start_layer,
        end_layer=layer.end_layer,
    )


def _kv_shape(model_config: Any) -> tuple[int, int]:
    """A model's KV heads and head dim on this rank, as SGLang sizes its KV pool."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    heads = model_config.get_num_kv_heads(parallel.attn_tp_size, parallel.attn_dcp_size)
    return heads, model_config.head_dim


def _check_draft_attention() -> None:
    """The draft worker's attention backend, as SGLang resolves it (a named
    `--speculative-draft-attention-backend`, else the target's prefill backend, else a
    platform default), must read the pool's strided views."""
    from sglang.srt.speculative.draft_worker_common import (
        resolve_draft_worker_attention_backend,
    )

    backend = resolve_draft_worker_attention_backend()
    if backend not in POOL_ATTENTION_BACKENDS:
        raise PoolBuildError(
            f"--jenga-pool does not serve the draft model's attention backend {backend}: of "
            f"SGLang's draft backends only triton reads the pool's strided KV views; pass "
            "--speculative-draft-attention-backend triton, or --no-jenga-pool"
        )


def remember_draft_pool(allocator: Any, pool: Any) -> None:
    """A draft worker's KV pool as built, over the target's `allocator`: it is indexed by the
    target's token slots, so the host tier must move its rows with the target's."""
    if allocator is not None:
        _DRAFT_POOLS[allocator.get_kvcache()] = pool


def remembered_draft_pool(kvcache: Any) -> Any | None:
    """The draft worker's KV pool beside the target's KV pool `kvcache` (over the Jenga pool's
    rows or SGLang's own; a hybrid pool's full-attention part), None without a draft model."""
    pool = _DRAFT_POOLS.get(kvcache)
    return None if pool is None else getattr(pool, "full_kv_pool", pool)
