"""SGLang's hierarchical cache (HiCache) on CPU: its real `UnifiedRadixCache.init_hicache`
stack driven as its scheduler drives it, the baseline of our host tier (docs/host-tier.md).

SGLang 0.5.23 builds the stack with `build_hybrid_mamba_stack`: an `MHATokenToKVPoolHost` and a
`MambaPoolHost`, each `--hicache-ratio` times its device pool (the device's static KV/Mamba
split, kept on host), and a `HybridCacheController` that copies through an
`L2TransferEngine`. All of it runs on device="cpu" with one shim, **`cpu_shim`**, which changes
what does not exist on a CPU and nothing the cache decides:

* CUDA host pinning (`pool_host.common._cuda_host_register`, where stock HiCache fails on
  CPU) is skipped;
* the byte copies between the pools (`*_physical` on the host pools: sgl_kernel's CUDA
  transfer kernels) are skipped, as sglang_pools.py skips compaction's copies: the replay
  never reads KV or state contents. Index bookkeeping, host allocation, acknowledgements and
  the tree's demotions and load-backs all run. The slots each transfer moves are counted
  per pool (`TRANSFERS`), which gives the bytes at the model's real sizes.

CPU streams and events complete at once, so every copy is acknowledged by the next
`check_hicache_events`, which the driver calls where the scheduler's loop would: after a
request is admitted and after it finishes.

Serving one request adds to SglangNativeCache's steps what the scheduler's PrefillAdder does
with a host hit (schedule_policy.py): with the matched node pinned and the best match
host-locked, `init_load_back`; the request then resumes from `last_node` with its
`host_loaded_length` added to its prefix, takes its lock there, and the loads start
(`ready_to_load_host_cache`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from jenga_sglang.bench.drivers.sglang_native import MAMBA_CHUNK, SglangNativeCache
from jenga_sglang.bench.drivers.sglang_split import SglangSplit
from jenga_sglang.bench.simulation.replay import ReplayStats
from jenga_sglang.bench.traces.packed import PackedRequest
from jenga_sglang.models.spec import ModelSpec

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")

#: slots moved since the shim went in: (direction, pool) -> count ("d2h"/"h2d", "kv"/"state")
TRANSFERS: dict[tuple[str, str], int] = {}


def cpu_shim() -> None:
    """Let SGLang's HiCache stack run on a CPU (module docstring); idempotent."""
    from sglang.srt.mem_cache import l2_transfer
    from sglang.srt.mem_cache.pool_host import base, common
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost

    engine = l2_transfer.L2TransferEngine
    if getattr(engine, "_jenga_cpu_shim", False):
        return
    common._cuda_host_register = _no_pinning
    for pool in (base.HostKVCache, MambaPoolHost):
        pool.backup_from_device_all_layer_physical = _no_copy
        pool.load_to_device_per_layer_physical = _no_copy
    to_host, to_device = engine.submit_device_to_host, engine.submit_host_to_device

    def counted_to_host(self: Any, transfers: list[Any]) -> Any:
        _count("d2h", transfers, MambaPoolHost)
        return to_host(self, transfers)

    def counted_to_device(self: Any, transfers: list[Any], **kwargs: Any) -> Any:
        _count("h2d", transfers, MambaPoolHost)
        return to_device(self, transfers, **kwargs)

    engine.submit_device_to_host = counted_to_host
    engine.submit_host_to_device = counted_to_device
    engine._jenga_cpu_shim = True


def _no_pinning(*_: Any, **__: Any) -> None:
    """CUDA host registration: nothing to pin without a GPU."""


def _no_copy(*_: Any, **__: Any) -> None:
    """A host pool's byte copy: skipped (nothing reads the bytes; `TRANSFERS` counts them)."""


def _count(direction: str, transfers: list[Any], state_pool: type) -> None:
    for transfer in transfers:
        pool = "state" if isinstance(transfer.host_pool, state_pool) else "kv"
        key = (direction, pool)
        TRANSFERS[key] = TRANSFERS.get(key, 0) + len(transfer.host_indices)


def server_args(host_ratio: float, write_policy: str) -> Any:
    """SGLang's global ServerArgs for HiCache over the static split (sglang_pools.server_args
    plus the hierarchical cache): host pools `host_ratio` times the device pools, `direct`
    IO and the page-first layout its Mamba host pool requires."""
    from sglang.kernels.ops.attention.fla.chunk_delta_h import CHUNK_SIZE
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    if write_policy not in WRITE_POLICIES:
        raise ValueError(f"unknown HiCache write policy {write_policy!r}; known: {WRITE_POLICIES}")
    args = ServerArgs(
        model_path="dummy",
        page_size=1,
        mamba_radix_cache_strategy="extra_buffer",
        disable_overlap_schedule=False,
        enable_hierarchical_cache=True,
        hicache_ratio=host_ratio,
        hicache_write_policy=write_policy,
        hicache_io_backend="direct",
        hicache_mem_layout="page_first_direct",
    )
    args._mamba_cache_chunk_size = CHUNK_SIZE
    set_global_server_args_for_scheduler(args)
    return args


class SglangHiCache(SglangNativeCache):
    """SGLang's UnifiedRadixCache with HiCache over the static split, served one request at a
    time; `serve` also returns the tokens of the hit loaded from host."""

    def __init__(
        self,
        spec: ModelSpec,
        split: SglangSplit,
        max_context_len: int,
        chunk_tokens: int,
        host_ratio: float,
        write_policy: str,
    ) -> None:
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        from jenga_sglang.bench.drivers import sglang_pools

        cpu_shim()
        args = server_args(host_ratio, write_policy)
        pools = sglang_pools.static_pools(spec, split, max_context_len)
        init = CacheInitParams(
            req_to_token_pool=pools.req_to_token_pool,
            token_to_kv_pool_allocator=pools.allocator,
            page_size=1,
            disable=False,
            tree_components=(ComponentType.FULL, ComponentType.MAMBA),
            enable_mamba_extra_buffer=True,
            eviction_policy="lru",
        )
        tree_cache = UnifiedRadixCache(params=init)
        tree_cache.init_hicache(args, init)
        # the attributes SglangNativeCache's scheduler steps read
        self.extra_buffer = True
        self.spec, self.split, self.chunk_tokens = spec, split, chunk_tokens
        self.kv_capacity = pools.kv_capacity
        self.req_pool, self.allocator = pools.req_to_token_pool, pools.allocator
        self._rid = 0
        self.tree_cache = tree_cache
        self._batch = SimpleNamespace(
            model_config=SimpleNamespace(
                hf_text_config=SimpleNamespace(mamba_chunk_size=MAMBA_CHUNK)
            ),
            tree_cache=tree_cache,
            req_to_token_pool=self.req_pool,
        )
        self.host_hit = 0  # of the last request served

    def admit(self, inp: Sequence[int], max_new: int) -> Any:
        """Match, load the host hit back as PrefillAdder does, lock, start the loads."""
        from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

        req = self.matched(inp, max_new)
        cache = self.tree_cache
        self.host_hit = 0
        if req.needs_host_load_back():
            pin = cache.lock(req.last_node)
            held = cache.inc_host_lock_ref(req.best_match_node).to_dec_params()
            try:
                params = InitLoadBackParams(
                    best_match_node=req.best_match_node,
                    host_hit_length=req.host_hit_length,
                    req=req,
                )
                req.host_loaded_length, req.last_node = cache.init_load_back(params)
            finally:
                cache.unlock(pin)
                cache.dec_host_lock_ref(req.best_match_node, held)
            req.prefix_len += req.host_loaded_length
            req.kv.cache_protected_len = req.prefix_len
            self.host_hit = req.host_loaded_length
        req.lock = cache.lock(req.last_node)
        cache.ready_to_load_host_cache()
        cache.check_hicache_events()
        return req

    def finish(self, req: Any, n_out: int) -> None:
        """Insert and unlock, then let the write-through copies be issued and acknowledged."""
        super().finish(req, n_out)
        self.tree_cache.check_hicache_events()

    def host_usage(self) -> dict[str, int]:
        """Host slots of each pool and how many are free now."""
        group = self.tree_cache.host_pool_group
        out: dict[str, int] = {}
        for name, entry in group.entry_map.items():
            pool = entry.host_pool
            label = str(getattr(name, "value", name)).lower()
            out[f"host_{label}_slots"] = int(pool.size)
            out[f"host_{label}_free"] = int(pool.available_size())
        return out


def replay_hicache(
    requests: Sequence[PackedRequest],
    spec: ModelSpec,
    split: SglangSplit,
    chunk_tokens: int,
    host_ratio: float,
    write_policy: str,
    ttft: Callable[[int, int, int], float] | None = None,
) -> tuple[ReplayStats, SglangHiCache]:
    """Sequential replay through SGLang's HiCache: the replay's totals with host hits, the
    bytes each direction moved at the model's sizes, and (`ttft`) the estimated time to
    first token of each request, as our tier's replay reports them."""
    longest = max((len(r.inp) + len(r.out) for r in requests), default=1)
    cache = SglangHiCache(spec, split, longest, chunk_tokens, host_ratio, write_policy)
    sizes = {"kv": spec.kv_bytes_per_token, "state": spec.state_bytes}
    stats = ReplayStats()
    start, cpu_start = time.perf_counter(), time.process_time()
    for req in requests:
        before = dict(TRANSFERS)
        hit = cache.serve(req.inp.tolist(), req.out.tolist())
        moved = {k: (v - before.get(k, 0)) * sizes[k[1]] for k, v in TRANSFERS.items()}
        load = sum(v for (d, _), v in moved.items() if d == "h2d")
        write = sum(v for (d, _), v in moved.items() if d == "d2h")
        host_hit = cache.host_hit if hit is not None else 0
        stats.count(len(req.inp), len(req.out), hit, spec.flops, host=(host_hit, load, write))
        if ttft is not None and hit is not None:
            stats.ttfts.append(ttft(len(req.inp), hit, load))
    stats.finish_timing(start, cpu_start, None)
    return stats, cache
