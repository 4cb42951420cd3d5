"""What the prefix cache costs SGLang's scheduler thread per request: our backend against
SGLang's own cache, driven by the same SGLang calls on the same request stream.

Both caches sit behind SGLang's real pools and scheduler helpers (bench/drivers/sglang_native.py's
`SglangNativeCache`: `alloc_req_slots`, `init_next_round_input` (match_prefix and the state's
copy-on-write), `lock`, per chunk `alloc_token_slots` (which evicts), `maybe_hand_to_session`
(where our backend counts the hit) and `checkpoint_kv_cache`, then
`release_kv_cache(checkpoint=True)`), so the only difference is the tree behind them.

One measurement, for a tree of about `nodes` nodes, prompts of `prompt_tokens` and `running`
requests in flight:

1. warm-up (untimed): `nodes` short sequences in groups build the tree (a shared 16-token group
   head, then 16 tokens of their own: one leaf each with a state at its end, one head per
   group). Each gets KV slots and a state slot from SGLang's allocators and goes in through the
   cache's `insert`, as a finished request's KV does, with the same calls for both caches; the
   duplicates' frees are grouped (`free_group_begin/end`, as the scheduler groups a batch's
   frees), `FREE_BATCH` sequences a group. Served whole through the scheduler path, with each
   free merging SGLang's free list by `torch.cat`, 100k nodes took over an hour to build;
2. fill (untimed): `running` requests are admitted and prefilled and stay in flight. Each
   prompt is a context shared by the whole point (`prompt_tokens - NEW_TOKENS` tokens, cached
   after the first request) plus `NEW_TOKENS` of its own: long prompts are mostly hits, as in
   multi-turn chat and agents, and the new tokens are what each request adds;
3. measured: `requests` more requests are each admitted and prefilled while the oldest running
   one finishes, so `running` stay in flight. Their scheduler-thread CPU time
   (`time.thread_time`) is split into tensor work (SGLang's Mamba state copies and clears: the
   hit's copy-on-write that the next extend batch runs, and any copy the cache makes itself;
   real memcpy on CPU, asynchronous device work on a GPU) and the rest, the bookkeeping.
   `jenga-bench overhead` runs torch on one thread, so no CPU work escapes that clock.

The pools hold the budget in slot counts with tiny per-slot tensors (bench/drivers/sglang_pools.py),
so tensor work here is a lower bound; bookkeeping does not depend on tensor sizes.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

#: "jenga-host": ours with the live host tier on (`--jenga-host-gb`, 4x the device budget);
#: nothing is evicted while measuring, so this is what the tier's bookkeeping adds to a request
CACHES = ("jenga", "sglang-native", "jenga-host")
HOST_RATIO = 4
NEW_TOKENS = 1024  # tokens each measured request adds past the shared context
GROUP = 64  # warm-up requests per group head
HEAD, TAIL = 16, 16  # warm-up request: group head + own tail
CHUNK_TOKENS = 8192  # prefill chunk (SGLang's default --chunked-prefill-size on large GPUs)
SPARE = 1.25  # slots beyond what the stream holds at once (no eviction while measuring)
FREE_BATCH = 512  # warm-up requests whose KV frees SGLang's allocator merges at once


@dataclass(frozen=True)
class Point:
    cache: str
    nodes: int
    prompt_tokens: int
    running: int


@dataclass(frozen=True)
class Measured:
    cache: str
    nodes: int
    prompt_tokens: int
    running: int
    bookkeeping_ms_per_request: float
    tensor_ms_per_request: float

    def row(self) -> dict[str, Any]:
        return asdict(self)


class TensorClock:
    """Thread CPU time spent inside SGLang's Mamba state copies and clears (patched in)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def install(self) -> Callable[[], None]:
        from sglang.srt.mem_cache.memory_pool import MambaPool

        originals = {name: getattr(MambaPool, name) for name in ("copy_from", "clear_slots")}

        def timed(original: Callable[..., Any]) -> Callable[..., Any]:
            def run(*a: Any, **k: Any) -> Any:
                start = time.thread_time()
                try:
                    return original(*a, **k)
                finally:
                    self.seconds += time.thread_time() - start

            return run

        for name, original in originals.items():
            setattr(MambaPool, name, timed(original))

        def uninstall() -> None:
            for name, original in originals.items():
                setattr(MambaPool, name, original)

        return uninstall


def _warm_prompts(nodes: int, rng: np.random.Generator) -> Iterator[list[int]]:
    heads = rng.integers(1, 1 << 20, size=(max(1, nodes // GROUP), HEAD))
    for i in range(max(1, nodes - len(heads))):
        tail = rng.integers(1, 1 << 20, size=TAIL)
        yield [*heads[i % len(heads)].tolist(), *tail.tolist()]


def _capacity(nodes: int, prompt_tokens: int, requests: int) -> tuple[int, int]:
    """(KV tokens, Mamba states) the whole stream of `requests` leaves cached, with room to
    spare: nothing is evicted, so the tree keeps its size while it is measured."""
    new = min(NEW_TOKENS, prompt_tokens)
    kv = nodes * (HEAD + TAIL) + max(prompt_tokens, CHUNK_TOKENS) + (requests + 1) * (new + 2)
    states = nodes + 4 * (requests + 2) + prompt_tokens // CHUNK_TOKENS + 8
    return int(kv * SPARE), int(states * SPARE)


def build_cache(cache: str, nodes: int, max_prompt: int, running: int, requests: int) -> Any:
    """SGLang's pools sized for a stream of `requests` after the warm-up (running ones
    included), with our tree or SGLang's behind them."""
    from jenga_sglang.bench.drivers.sglang_native import SglangNativeCache
    from jenga_sglang.bench.drivers.sglang_split import SglangSplit
    from jenga_sglang.models import get_spec

    if cache not in CACHES:
        raise ValueError(f"unknown cache {cache!r}; known: {', '.join(CACHES)}")
    spec = get_spec("marconi-7b")
    kv, states = _capacity(nodes, max_prompt, requests)
    per_token, slot = spec.kv_bytes_per_token, spec.state_bytes
    split = SglangSplit(kv * per_token + states * slot, kv, states, per_token, slot)
    tree = "sglang" if cache == "sglang-native" else "jenga"
    host_gb = HOST_RATIO * split.budget_bytes / 1e9 if cache == "jenga-host" else 0.0
    return SglangNativeCache(spec, split, max_prompt + 8, CHUNK_TOKENS, tree=tree,
                             max_running=running + 1, host_gb=host_gb)  # fmt: skip


def warm(native: Any, nodes: int, seed: int, tick: Callable[[], None]) -> None:
    """Step 1 of the module doc, the same calls for both caches. The room the open free group
    holds back (at most `FREE_BATCH` heads' duplicates) is within the pools' `SPARE`."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    allocator, states = native.allocator, native.req_pool.mamba_allocator
    allocator.free_group_begin()
    try:
        for i, prompt in enumerate(_warm_prompts(nodes, np.random.default_rng(seed)), 1):
            kv, state = allocator.alloc(len(prompt)), states.alloc(1)
            if kv is None or state is None:
                raise RuntimeError("the warm-up outgrew the pools")
            key = RadixKey(array("q", prompt))
            got = native.tree_cache.insert(InsertParams(key=key, value=kv, mamba_value=state))
            if got.prefix_len:
                allocator.free(kv[: got.prefix_len])  # the group head, cached already
            if got.mamba_exist:
                states.free(state)
            tick()
            if i % FREE_BATCH == 0:
                allocator.free_group_end()
                allocator.free_group_begin()
    finally:
        allocator.free_group_end()


def measure(
    native: Any, point: Point, requests: int, seed: int, tick: Callable[[], None]
) -> Measured:
    """Steps 2 and 3 of the module doc on a warmed cache; every request is finished after."""
    rng = np.random.default_rng(seed + point.prompt_tokens)
    new = min(NEW_TOKENS, point.prompt_tokens)
    context = rng.integers(1, 1 << 20, size=point.prompt_tokens - new)

    def prompt() -> array[int]:
        # Built untimed, as SGLang's tokenizer hands the scheduler an int64 array.
        ids = np.concatenate([context, rng.integers(1, 1 << 20, size=new)])
        return array("q", ids.astype(np.int64).tobytes())

    def start(ids: array[int]) -> Any:
        req = native.admit(ids, 1)
        _copy_on_write(native, req)
        native.prefill(req, 1)
        return req

    flight: deque[Any] = deque(start(prompt()) for _ in range(point.running))
    clock = TensorClock()
    uninstall = clock.install()
    total = 0.0
    try:
        for _ in range(requests):
            ids = prompt()
            began = time.thread_time()
            flight.append(start(ids))
            native.finish(flight.popleft(), 1)
            total += time.thread_time() - began
            tick()
    finally:
        uninstall()
        while flight:
            native.finish(flight.popleft(), 1)
    ms = 1000.0 / requests
    return Measured(
        point.cache, point.nodes, point.prompt_tokens, point.running,
        (total - clock.seconds) * ms, clock.seconds * ms,
    )  # fmt: skip


def _copy_on_write(native: Any, req: Any) -> None:
    """The hit's state copy the match staged, done as the next extend batch does it
    (`_collect_deferred_mamba_cow_and_clear`, then the pool's `copy_from` / `clear_slots`)."""
    pool = native.req_pool.mamba_pool
    dst = req.kv.mamba_pool_idx.reshape(1)
    if req.kv.mamba_cow_src_index is not None:
        pool.copy_from(req.kv.mamba_cow_src_index.reshape(1), dst)
    elif req.kv.mamba_needs_clear:
        pool.clear_slots(dst)
    req.kv.mamba_cow_src_index = None
    req.kv.mamba_needs_clear = False


def median(runs: list[Measured]) -> Measured:
    """The run of median bookkeeping cost (its own tensor figure with it): a shared machine's
    noise lands in single runs."""
    ranked = sorted(runs, key=lambda m: m.bookkeeping_ms_per_request)
    return ranked[len(ranked) // 2]
