"""SGLang's own cache stack, built on device="cpu" and driven as its scheduler drives it.

`SglangNativeCache` owns a real SGLang 0.5.23 `UnifiedRadixCache` (FULL + MAMBA components)
over a `HybridReqToTokenPool` (request rows + Mamba slots), a `HybridLinearKVPool` and a
`TokenToKVPoolAllocator`, sized by `SglangSplit` (bench/drivers/sglang_split.py), or SGLang's
unified memory pool over the same budget (bench/drivers/sglang_pools.py builds both).

Serving one request reuses SGLang's own scheduler helpers, in the scheduler's order:
`alloc_req_slots` (request row, Mamba slot, two ping-pong track slots), `init_next_round_input`
(match_prefix with copy-on-write of the matched state; the key is capped at input - 1 tokens),
`tree_cache.lock(last_node)`, the hit's KV slots read off the tree into the request's row
(`prefix_device_indices`, as `alloc_for_extend` does), then per prefill chunk
`alloc_token_slots` (evicting LRU),
`ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend` (which position's state is tracked:
the chunk end floored to the 64-token grid, or the match's branching point instead), and
`checkpoint_kv_cache`. Decode allocates the KV of output tokens 0..n-2 (the last sampled token
never gets KV) and tracks a state at every multiple of `mamba_track_interval` (256), as the
batch result processor does; `release_kv_cache(checkpoint=True)` finishes. Strategy:
`extra_buffer` (what `auto` resolves to with the overlap scheduler on), page size 1, LRU.

Importing sglang takes 15-27 s, so nothing here imports it until a cache is built.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from jenga_sglang.bench.drivers.sglang_split import SglangSplit
from jenga_sglang.bench.simulation.replay import ReplayStats
from jenga_sglang.bench.traces.packed import PackedRequest
from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.registry import PolicyRecord, bundle

MAMBA_CHUNK = 64  # FLA chunk = SGLang's mamba_cache_chunk_size at page size 1
TRACK_INTERVAL = 256  # --mamba-track-interval default


class SglangNativeCache:
    """SGLang's real cache stack for `split`, serving requests one at a time (see module doc).

    `unified` picks `--enable-unified-memory` (one buffer, the split floats) over the static
    split. `serve(inp, out)` returns the device prefix SGLang reused for `inp` (its token hit).
    Requests whose input + output exceed the KV capacity are not served (SGLang rejects them):
    `serve` returns None and the tree is untouched.
    """

    def __init__(
        self,
        spec: ModelSpec,
        split: SglangSplit,
        max_context_len: int,
        chunk_tokens: int,
        unified: bool = False,
        tree: str = "sglang",
        max_running: int = 1,
        policy: PolicyRecord | None = None,
        host_gb: float = 0.0,
    ) -> None:
        if chunk_tokens < MAMBA_CHUNK:
            raise ValueError(f"chunk_tokens must be >= {MAMBA_CHUNK}, got {chunk_tokens}")
        from jenga_sglang.bench.drivers import sglang_pools

        # Our backend needs exact states: no_buffer keeps the live state at each chunk's end.
        self.extra_buffer = tree == "sglang"
        sglang_pools.server_args(unified, self.extra_buffer)
        if unified:
            pools = sglang_pools.unified_pools(spec, split, max_context_len, self.extra_buffer)
        else:
            pools = sglang_pools.static_pools(
                spec, split, max_context_len, self.extra_buffer, max_running
            )
        self.spec = spec
        self.split = split
        self.chunk_tokens = chunk_tokens
        self.kv_capacity = pools.kv_capacity
        self.req_pool = pools.req_to_token_pool
        self.allocator = pools.allocator
        self._rid = 0
        self.tree_cache = _radix_cache(
            self.req_pool, self.allocator, spec, tree, self.extra_buffer, policy, host_gb
        )
        # What ScheduleBatch reads when it picks the tracked state of a prefill chunk.
        self._batch = SimpleNamespace(
            model_config=SimpleNamespace(
                hf_text_config=SimpleNamespace(mamba_chunk_size=MAMBA_CHUNK)
            ),
            tree_cache=self.tree_cache,
            req_to_token_pool=self.req_pool,
        )

    def serve(self, inp: Sequence[int], out: Sequence[int]) -> int | None:
        if len(inp) == 0:
            raise ValueError("request has no input tokens")
        if len(inp) + len(out) > self.kv_capacity:
            return None
        req = self.admit(inp, len(out))
        hit = int(req.prefix_len)
        self.prefill(req, out[0] if out else None)
        self._decode(req, inp, out)
        self.finish(req, len(out))
        return hit

    # The scheduler's steps for one request, in its order (`serve` runs them back to back;
    # bench/studies/overhead.py keeps many requests between `prefill` and `finish`).

    def admit(self, inp: Sequence[int], max_new: int) -> Any:
        """A new request: its row and Mamba slot, the prefix match and the lock."""
        req = self.matched(inp, max_new)
        req.lock = self.tree_cache.lock(req.last_node)  # as PrefillAdder does on admission
        return req

    def matched(self, inp: Sequence[int], max_new: int) -> Any:
        """A new request with its row and Mamba slot and its prefix matched (no lock yet)."""
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.mem_cache.allocation import alloc_req_slots
        from sglang.srt.sampling.sampling_params import SamplingParams

        self._rid += 1
        req = Req(
            rid=str(self._rid),
            origin_input_text="",
            origin_input_ids=array("q", inp),
            sampling_params=SamplingParams(temperature=0, max_new_tokens=max(1, max_new)),
        )
        alloc_req_slots(self.req_pool, [req], self.tree_cache)
        req.init_next_round_input(self.tree_cache)  # match_prefix, COW of the matched state
        return req

    def prefill(self, req: Any, first_output: int | None) -> None:
        """Every prefill chunk: KV slots, the tracked state, `checkpoint_kv_cache`."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.mem_cache.common import checkpoint_kv_cache

        total = len(req.origin_input_ids)
        if req.prefix_len > 0:  # alloc_for_extend: the hit's slots, read off the tree
            prefix = self.tree_cache.prefix_device_indices(req)
            self.req_pool.write((req.kv.req_pool_idx, slice(0, req.prefix_len)), prefix)
        while req.prefix_len < total:
            start = req.prefix_len
            end = min(start + self.chunk_tokens, total)
            branch = req.mamba_branching_seqlen
            if not self.extra_buffer and branch is not None and start < branch < end:
                end = branch  # the chunk ends at the branch point: its live state is exact
            req.extend_end = end
            self._alloc_kv(req, start, end)
            self.tree_cache.maybe_hand_to_session(req)  # alloc_for_extend's, per extend
            if self.extra_buffer:
                ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend(self._batch, req)
            if end == total and first_output is not None:
                req.output_ids.append(first_output)  # the prefill's sampled token
            checkpoint_kv_cache(req, self.tree_cache)  # also moves prefix_len to extend_end

    def _decode(self, req: Any, inp: Sequence[int], out: Sequence[int]) -> None:
        """Decode steps 1..n-1: each writes the KV of the previous output token."""
        if len(out) < 2:
            return
        base = len(inp)
        self._alloc_kv(req, base, base + len(out) - 1)
        pool = self.req_pool
        for k in range(1, len(out)):
            committed = base + k
            req.kv.kv_committed_len = committed
            req.output_ids.append(out[k])
            if self.extra_buffer and committed % TRACK_INTERVAL == 0:  # result processor
                req.kv.mamba_last_track_idx = req.kv.mamba_next_track_idx
                req.kv.mamba_prev_track_seqlen = req.kv.mamba_last_track_seqlen
                req.kv.mamba_last_track_seqlen = committed
                req.kv.mamba_next_track_idx = pool.get_mamba_ping_pong_other_idx(
                    req.kv.mamba_next_track_idx
                )

    def _alloc_kv(self, req: Any, start: int, end: int) -> None:
        from sglang.srt.mem_cache.allocation import alloc_token_slots

        loc = alloc_token_slots(self.tree_cache, end - start)  # evicts the tree's LRU leaves first
        self.req_pool.write((req.kv.req_pool_idx, slice(start, end)), loc)
        req.kv.kv_committed_len = end
        req.kv.kv_allocated_len = end

    def finish(self, req: Any, n_out: int) -> None:
        """The request ends: `release_kv_cache(checkpoint=True)` inserts and unlocks."""
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.mem_cache.common import release_kv_cache

        req.finished_reason = FINISH_LENGTH(length=n_out)
        release_kv_cache(req, self.tree_cache, checkpoint=True)

    def usage(self) -> dict[str, int]:
        """Cached (evictable) KV tokens and Mamba states, and what is free, right now."""
        return {
            "kv_cached_tokens": int(self.tree_cache.full_evictable_size()),
            "mamba_cached_states": int(self.tree_cache.mamba_evictable_size()),
            "kv_free_tokens": int(self.allocator.available_size()),
            "mamba_free_slots": int(self.req_pool.mamba_allocator.available_size()),
        }


TREES = ("sglang", "jenga")


def _radix_cache(
    req_pool: Any,
    allocator: Any,
    spec: ModelSpec,
    tree: str,
    extra_buffer: bool,
    policy: PolicyRecord | None = None,
    host_gb: float = 0.0,
) -> Any:
    """SGLang's UnifiedRadixCache, or (`tree="jenga"`) our backend behind the same contract,
    running `policy` (default: the `jenga` bundle), over a live host tier of `host_gb`."""
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    if tree not in TREES:
        raise ValueError(f"unknown tree {tree!r}; known: {', '.join(TREES)}")
    init = CacheInitParams(
        req_to_token_pool=req_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=1,
        disable=False,
        tree_components=(ComponentType.FULL, ComponentType.MAMBA),
        enable_mamba_extra_buffer=extra_buffer,
        eviction_policy="lru",
    )
    if tree == "jenga":
        from jenga_sglang.binding.cache.backend import JengaRadixCache
        from jenga_sglang.binding.options import JengaOptions

        # A bundle as the pure replay runs it (traces resend replies verbatim: no prompt-end
        # state unless the bundle keeps one), not the server's default.
        options = JengaOptions(enabled=True, policy=policy or bundle("jenga"), host_gb=host_gb)
        return JengaRadixCache(init, spec, options)
    return UnifiedRadixCache(params=init)


def replay_native(
    requests: Sequence[PackedRequest],
    spec: ModelSpec,
    split: SglangSplit,
    chunk_tokens: int,
    unified: bool = False,
    tree: str = "sglang",
    policy: PolicyRecord | None = None,
) -> tuple[ReplayStats, SglangNativeCache]:
    """Sequential replay (bench/simulation/replay.py's order and totals) through SGLang's own cache,
    or (`tree="jenga"`) through our backend running `policy`."""
    longest = max((len(r.inp) + len(r.out) for r in requests), default=1)
    cache = SglangNativeCache(spec, split, longest, chunk_tokens, unified, tree, policy=policy)
    stats = ReplayStats()
    start, cpu_start = time.perf_counter(), time.process_time()
    for req in requests:
        hit = cache.serve(req.inp.tolist(), req.out.tolist())
        stats.count(len(req.inp), len(req.out), hit, spec.flops)
    stats.finish_timing(start, cpu_start, None)
    return stats, cache
