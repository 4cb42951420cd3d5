"""SGLang's Mamba usage figure over the Jenga pool.

SGLang 0.5.23 computes its usage figures in `SchedulerPoolStatsObserver` (log lines "Prefill
batch" / "Decode batch", `get_server_info`'s load, the Prometheus gauges `token_usage`,
`full_token_usage`, `mamba_usage`, and the prefill delayer's throttle): a type's usage is what
requests hold of it, not counting what the tree could evict, over what the type can hold.

* KV: `(size - available - evictable) / size`, and our KV allocator's `size` is already what KV
  can hold now (`available_size() + allocated`, binding/pools/allocator.py), the meaning SGLang's
  own unified allocator gives it, so that figure is right as SGLang computes it.
* Mamba: SGLang divides by `mamba_pool.size`, a constant. Over the Jenga pool that constant is
  the most states the buffer could hold if every page were a state, so the figure shrinks toward
  0 however much of the pool KV has taken. The AFTER hook on `_get_mamba_token_info` keeps
  SGLang's numerator and divides by what states can hold now, `allocated + room`
  (pool/shared.py). `mamba_available_size` keeps SGLang's meaning (`size - allocated`): the idle
  leak check sums it against `mamba_pool.size`.

Both figures are fractions of a shared byte budget: with SGLang's CPU sizing (a few percent of
RAM as states and a `--max-total-tokens` KV share) most of the budget is state bytes, so KV can
hold far more tokens than `--max-total-tokens` and its usage stays small (docs/sglang.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jenga_sglang.binding.pools.allocator import JengaMambaAllocator

OBSERVER = "sglang.srt.managers.scheduler_components.pool_stats_observer.SchedulerPoolStatsObserver"


def mamba_capacity_now(allocator: JengaMambaAllocator) -> int:
    """States the pool can hold now: those allocated plus those `alloc` could still take."""
    shared = allocator.shared
    return int(shared.allocated(allocator.state_type) + shared.room(allocator.state_type))


def after_mamba_token_info(result: Any, observer: Any, *a: Any, **k: Any) -> Any:
    """SGLang's PoolStats with `mamba_usage` over what states can hold now (module doc)."""
    allocator = getattr(observer.req_to_token_pool, "mamba_allocator", None)
    if not isinstance(allocator, JengaMambaAllocator) or result.mamba_num_used is None:
        return None  # stock pools: keep SGLang's figure
    capacity = mamba_capacity_now(allocator)
    usage = result.mamba_num_used / capacity if capacity else 0.0
    return dataclasses.replace(result, mamba_usage=usage)


def register(registry: Any, hook_type: Any) -> None:
    registry.register(f"{OBSERVER}._get_mamba_token_info", after_mamba_token_info, hook_type.AFTER)
