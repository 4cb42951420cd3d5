"""What SGLang's scheduler does around the cache, as the test harnesses
(tests/mamba_session.py, tests/swa_session.py) drive it: PrefillAdder's steps with a matched
request before it allocates its slots, and `flush_cache` on an idle scheduler."""

from __future__ import annotations

from typing import Any


def lock_and_load_back(cache: Any, req: Any) -> None:
    """Pin the match while deciding (`add_one_req`), load a host hit back if the match offered
    one (`init_load_back`: all of the promised tokens or none), then take the request's own
    lock on where its prefix now ends."""
    from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

    pin = cache.lock(req.last_node)
    try:
        if req.needs_host_load_back():
            loaded = cache.init_load_back(
                InitLoadBackParams(
                    best_match_node=req.best_match_node,
                    host_hit_length=req.host_hit_length,
                    req=req,
                )
            )
            assert loaded is not None
            req.host_loaded_length, req.last_node = loaded
            req.prefix_len += req.host_loaded_length
            req.kv.cache_protected_len = req.prefix_len  # load_back_is_cache_owned()
        req.lock = cache.lock(req.last_node)  # its commit
    finally:
        cache.unlock(pin)


def flush_cache(cache: Any, req_to_token_pool: Any, allocator: Any) -> None:
    """`Scheduler.flush_cache` on an idle scheduler: the cache's reset, then the pools
    cleared."""
    cache.reset()
    req_to_token_pool.clear()
    allocator.clear()
    req_to_token_pool.reset_aux_cache_allocator()
