"""Serve real SGLang `Req`s of a hybrid-SWA model (gpt-oss's layout) through our backend.

SGLang's own CPU pools: `SWAKVPool` (a full pool and a smaller sliding-window pool) behind
`SWATokenToKVPoolAllocator`, whose `full_to_swa_index_mapping` gives each full slot of a row its
window slot. A request goes the scheduler's way: `init_next_round_input` (match_prefix), the
tree lock, `alloc_req_slots`, per chunk `alloc_token_slots` / `alloc_paged_token_slots_extend`
+ a forward + `checkpoint_kv_cache`, decode steps that free the request's out-of-window window
slots as `ScheduleBatch.maybe_evict_swa` does (`evict_sliding_windows`), and
`release_kv_cache(checkpoint=True)`.

The "forward" writes into every slot it computes a value that names the prefix it is the KV of
(a rolling hash of tokens [0, i], exact in float32): in the full pool at the row's slot and in
the window pool at the slot the mapping names. `check_window` then reads what a window layer
of the request would read, through SGLang's mapping, and compares.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tests.admission import lock_and_load_back

WINDOW = 8  # the window layers' attention window (SGLang's sliding_window_size + 1)


def kv_value(tokens: Sequence[int], i: int) -> float:
    """The emulated KV of position i: a hash of tokens [0, i] below 2**20 (exact in fp32)."""
    h = 0
    for t in tokens[: i + 1]:
        h = (h * 31 + t + 1) % 1_000_003
    return float(h % (1 << 20))


def window_params(page: int, full: int, swa: int) -> Any:
    import torch
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=page))
    req_pool = ReqToTokenPool(size=8, max_context_len=512, device="cpu", enable_memory_saver=False)
    kv = SWAKVPool(
        size=full,
        size_swa=swa,
        page_size=page,
        dtype=torch.float32,
        head_num=1,
        head_dim=1,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device="cpu",
    )
    allocator = SWATokenToKVPoolAllocator(
        size=full,
        size_swa=swa,
        page_size=page,
        dtype=torch.float32,
        device="cpu",
        kvcache=kv,
        need_sort=False,
        req_to_token_pool=req_pool,
    )
    return CacheInitParams(
        disable=False,
        req_to_token_pool=req_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=page,
        sliding_window_size=WINDOW - 1,
    )


def jenga_window_params(budget_bytes: int, page: int = 1) -> Any:
    """The same model on the Jenga pool: full and window KV carved from one buffer
    (binding/pools/build.py `build_jenga_swa_pools`)."""
    import torch
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from jenga_sglang.binding.pools.build import KVShape, build_jenga_swa_pools

    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=page))
    pools = build_jenga_swa_pools(
        full=KVShape((1,), 1, 1, torch.float32),
        window=KVShape((0,), 1, 1, torch.float32),
        budget_bytes=budget_bytes,
        device="cpu",
        req_to_token_pool=ReqToTokenPool(
            size=8, max_context_len=512, device="cpu", enable_memory_saver=False
        ),
        page_size=page,
    )
    return CacheInitParams(
        disable=False,
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool_allocator=pools.token_to_kv_pool_allocator,
        page_size=page,
        sliding_window_size=WINDOW - 1,
    )


def window_spec() -> Any:
    from jenga_sglang.models.spec import AttentionGroup, DType, MlpGroup, ModelSpec

    full = AttentionGroup("full", 1, 1, 1, DType.FP32, 10.0, 1.0)
    window = AttentionGroup("sliding", 1, 1, 1, DType.FP32, 10.0, 1.0, window=WINDOW)
    return ModelSpec("tiny-swa", (window, full, MlpGroup("mlp", 2, 5.0)), hidden_size=4)


class SwaSession:
    """One engine: SGLang's SWA pools + our cache, serving requests as the scheduler does."""

    def __init__(
        self,
        page: int = 1,
        full: int = 512,
        swa: int = 256,
        chunk: int = 64,
        jenga_bytes: int | None = None,
        host_gb: float = 0.0,
    ) -> None:
        """SGLang's pools of `full` and `swa` slots, or with `jenga_bytes` the Jenga pool of
        that many bytes (a K and a V float per token and layer: 8 bytes a slot); `host_gb` >
        0: `--jenga-host-gb`, at rates that make every load beat its recompute (a fast link,
        a slow prefill: the tiny spec's prefix costs next to nothing)."""
        import torch
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
        from sglang.srt.mem_cache import allocation, common
        from sglang.srt.sampling.sampling_params import SamplingParams

        from jenga_sglang.binding.cache.backend import JengaRadixCache
        from jenga_sglang.binding.cache.compat import sglang_windows
        from jenga_sglang.binding.options import SERVER_POLICY, JengaOptions

        self.torch, self.Req, self.FINISH_LENGTH = torch, Req, FINISH_LENGTH
        self.SamplingParams, self.allocation, self.common = SamplingParams, allocation, common
        self.page, self.chunk = page, chunk
        params = (
            window_params(page, full, swa)
            if jenga_bytes is None
            else jenga_window_params(jenga_bytes, page)
        )
        self.pool = params.req_to_token_pool
        self.alloc = params.token_to_kv_pool_allocator
        self.kv = self.alloc.get_kvcache()
        policy = replace(SERVER_POLICY, eviction="lru")
        spec = sglang_windows(window_spec(), params.swa_retain_window)  # as the factory does
        options = JengaOptions(
            enabled=True, policy=policy, host_gb=host_gb, host_bw=1e6, prefill_tflops=1e-12
        )
        self.cache = JengaRadixCache(params, spec, options)
        self.rid = 0

    # ------------------------------------------------------------------ the emulated forward

    def _write(self, req: Any, toks: Sequence[int], start: int, end: int) -> None:
        row = self.pool.req_to_token[req.kv.req_pool_idx]
        for i in range(start, end):
            full = int(row[i])
            value = kv_value(toks, i)
            self.kv.full_kv_pool.k_buffer[0][full, 0, 0] = value
            window = int(self.alloc.full_to_swa_index_mapping[full])
            assert window > 0, f"position {i}: the forward has no window slot to write"
            self.kv.swa_kv_pool.k_buffer[0][window, 0, 0] = value

    def check_window(self, req: Any, toks: Sequence[int], length: int) -> None:
        """What the request's layers read for positions [0, length): every full slot, and
        through the mapping the window slots of the last WINDOW - 1 positions."""
        row = self.pool.req_to_token[req.kv.req_pool_idx]
        for i in range(length):
            assert float(self.kv.full_kv_pool.k_buffer[0][int(row[i]), 0, 0]) == kv_value(toks, i)
        for i in range(max(0, length - (WINDOW - 1)), length):
            window = int(self.alloc.full_to_swa_index_mapping[int(row[i])])
            assert window > 0, f"position {i} of {length}: no window slot"
            got = float(self.kv.swa_kv_pool.k_buffer[0][window, 0, 0])
            assert got == kv_value(toks, i), f"position {i}: window KV of another prefix"

    # ------------------------------------------------------------------ serving

    def admit(self, inp: Sequence[int], max_new: int) -> Any:
        self.rid += 1
        req = self.Req(
            rid=str(self.rid),
            origin_input_text="",
            origin_input_ids=array("q", inp),
            sampling_params=self.SamplingParams(temperature=0, max_new_tokens=max(1, max_new)),
        )
        req.init_next_round_input(self.cache)
        lock_and_load_back(self.cache, req)
        self.allocation.alloc_req_slots(self.pool, [req], self.cache)
        hit = int(req.prefix_len)
        if hit:
            prefix = self.cache.prefix_device_indices(req)
            self.pool.write((req.kv.req_pool_idx, slice(0, hit)), prefix)
        self.cache.maybe_hand_to_session(req)  # alloc_for_extend's, once the row is written
        req.kv.kv_committed_len = req.kv.kv_allocated_len = hit
        self.check_window(req, inp, hit)
        return req

    def prefill(self, req: Any, first_output: int) -> None:
        toks = list(req.origin_input_ids)
        total = len(toks)
        while req.prefix_len < total:
            start = req.prefix_len
            end = min(start + self.chunk, total)
            req.extend_end = end
            self._alloc(req, start, end)
            self._write(req, toks, start, end)
            if end == total:
                req.output_ids.append(first_output)
            self.common.checkpoint_kv_cache(req, self.cache)
            self.check_window(req, toks, end)

    def decode_and_finish(self, req: Any, inp: Sequence[int], out: Sequence[int]) -> None:
        seq = [*inp, *out]
        for k in range(1, len(out)):
            pos = len(inp) + k - 1  # the KV this step computes: of the previous output
            self._alloc(req, pos, pos + 1)
            self._write(req, seq, pos, pos + 1)
            req.output_ids.append(out[k])
            self.check_window(req, seq, pos + 1)
            self.cache.evict_sliding_windows(req, pos)  # ScheduleBatch.maybe_evict_swa
        req.finished_reason = self.FINISH_LENGTH(length=len(out))
        self.common.release_kv_cache(req, self.cache, checkpoint=True)

    def serve(self, inp: Sequence[int], out: Sequence[int]) -> int:
        """Serve one request; returns its hit."""
        req = self.admit(inp, len(out))
        hit = int(req.prefix_len)
        self.prefill(req, out[0])
        self.decode_and_finish(req, inp, out)
        self.check_pools()
        return hit

    def _alloc(self, req: Any, start: int, end: int) -> None:
        torch = self.torch
        if self.page == 1:
            loc = self.allocation.alloc_token_slots(self.cache, end - start)
        else:
            row = self.pool.req_to_token[req.kv.req_pool_idx]
            last = torch.tensor([int(row[start - 1]) if start else -1], dtype=torch.int64)
            prefix = torch.tensor([start], dtype=torch.int64)
            seq = torch.tensor([end], dtype=torch.int64)
            loc = self.allocation.alloc_paged_token_slots_extend(
                self.cache, prefix, prefix, seq, seq, last, end - start
            )
        self.pool.write((req.kv.req_pool_idx, slice(start, end)), loc)
        req.kv.kv_committed_len = req.kv.kv_allocated_len = end

    # ------------------------------------------------------------------ accounting

    def check_pools(self) -> None:
        """Idle: every full and window slot is free or the tree's, once; the tree's full
        slots name the window slots it holds (slots/windows.py's invariant)."""
        cache = self.cache
        cache.sanity_check()
        tree = cache.cache.tree
        full_slot, window_slot = cache.slot_tree.kv_slot, cache.slot_tree.window_slot
        assert window_slot is not None
        mapping = self.alloc.full_to_swa_index_mapping
        full_held: list[int] = []
        window_held: list[int] = []
        for node in tree.nodes():
            full = node.kv[full_slot].ids()
            window = node.kv[window_slot].ids()
            tomb = node.tombstones[window_slot]
            assert [int(mapping[f]) for f in full[tomb:]] == window, node
            assert all(int(mapping[f]) == 0 for f in full[:tomb]), node  # no stale pointer
            full_held += full
            window_held += window
        assert len(set(full_held)) == len(full_held) and len(set(window_held)) == len(window_held)
        assert self.alloc.full_available_size() + len(full_held) == self.alloc.size_full
        assert self.alloc.swa_available_size() + len(window_held) == self.alloc.size_swa
        assert cache.swa_evictable_size() == len(window_held)
