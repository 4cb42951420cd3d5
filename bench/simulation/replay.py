"""Sequential replay (Marconi's method) and the statistics both replay modes keep.

Sequential replay serves requests one at a time in trace order: match(input), then insert
(input + output). Nothing runs concurrently, so no request holds pages while another is served;
the result depends only on the cache and its policy. Token hit rate = skipped prefill tokens /
input tokens; FLOPs saved come from the model spec (F(hit) per request).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jenga_sglang.bench.traces.packed import PackedRequest
from jenga_sglang.policies.tuning import AlphaTuner
from jenga_sglang.radix.cache import PrefixCache


@dataclass
class ReplayStats:
    """Totals of one replay. `wall_s` excludes alpha tuning, which is `tuning_s`.

    `cpu_s` and `tuning_cpu_s` are the same spans in this process's CPU time: on a shared
    machine wall time also counts waiting for a core.
    """

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    hit_tokens: int = 0
    flops_saved: float = 0.0
    flops_total: float = 0.0
    states_planned: int = 0
    uncached_requests: int = 0
    wall_s: float = 0.0
    tuning_s: float = 0.0
    cpu_s: float = 0.0
    tuning_cpu_s: float = 0.0
    # a host-memory tier (docs/host-tier.md): hit tokens loaded from it, bytes loaded back
    # (host -> device) and written by demotion (device -> host)
    host_hit_tokens: int = 0
    host_load_bytes: int = 0
    host_write_bytes: int = 0
    ttfts: list[float] = field(default_factory=list)  # estimated, per request (`ttft`)

    def fields(self) -> dict[str, Any]:
        """The replay part of a run record (flat, JSON-able)."""
        return {
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "hit_tokens": self.hit_tokens,
            "token_hit_rate": self.token_hit_rate,
            "flops_saved": self.flops_saved,
            "flops_saved_ratio": self.flops_saved_ratio,
            "states_planned": self.states_planned,
            "uncached_requests": self.uncached_requests,
            "wall_s": self.wall_s,
            "tuning_s": self.tuning_s,
            "cpu_s": self.cpu_s,
            "tuning_cpu_s": self.tuning_cpu_s,
            "device_hit_tokens": self.hit_tokens - self.host_hit_tokens,
            "host_hit_tokens": self.host_hit_tokens,
            "host_load_bytes": self.host_load_bytes,
            "host_write_bytes": self.host_write_bytes,
            "host_transfer_bytes": self.host_load_bytes + self.host_write_bytes,
        }

    def count(
        self,
        input_tokens: int,
        output_tokens: int,
        hit: int | None,
        flops: Callable[[int], float],
        states_planned: int = 0,
        fits: bool = True,
        host: tuple[int, int, int] = (0, 0, 0),
    ) -> None:
        """Add one finished request. `hit`: the tokens it reused, None when it was not served
        (SGLang rejects a request larger than its pool); `flops(n)`: the prefill FLOPs of n
        tokens; `fits`: False when its pages could not be stored. Either failure counts it
        among `uncached_requests`. `host`: (hit tokens loaded from a host tier, bytes loaded,
        bytes written to it) while it was served."""
        self.host_hit_tokens += host[0]
        self.host_load_bytes += host[1]
        self.host_write_bytes += host[2]
        self.requests += 1
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.flops_total += flops(input_tokens)
        if hit is not None:
            self.hit_tokens += hit
            self.flops_saved += flops(hit)
            self.states_planned += states_planned
        self.uncached_requests += hit is None or not fits

    def finish_timing(self, start: float, cpu_start: float, tuner: AlphaTuner | None) -> None:
        """Set the time fields from perf_counter / process_time readings taken at the start."""
        self.tuning_s = tuner.log.seconds if tuner is not None else 0.0
        self.tuning_cpu_s = tuner.log.cpu_seconds if tuner is not None else 0.0
        self.wall_s = time.perf_counter() - start - self.tuning_s
        self.cpu_s = time.process_time() - cpu_start - self.tuning_cpu_s

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def flops_saved_ratio(self) -> float:
        return self.flops_saved / self.flops_total if self.flops_total else 0.0


def replay_sequential(
    requests: Sequence[PackedRequest],
    cache: PrefixCache,
    tuner: AlphaTuner | None,
    check: bool = False,
    ttft: Callable[[int, int, int], float] | None = None,
) -> ReplayStats:
    """Serve `requests` in order through `cache`; `check` verifies the tree after each one.
    `ttft(input tokens, hit tokens, bytes loaded from host)`: the estimated time to first
    token of each request, kept in `ttfts`."""
    stats = ReplayStats()
    start, cpu_start = time.perf_counter(), time.process_time()
    for i, req in enumerate(requests):
        res = cache.serve(req.inp, req.out, owner=i)
        flops = cache.cost.flops  # memoised spec.flops: res.flops_saved is flops(hit)
        host = (res.host_hit_tokens, res.host_load_bytes, res.host_write_bytes)
        stats.count(
            len(req.inp), len(req.out), res.hit_tokens, flops, res.states_planned, res.cached, host
        )
        if ttft is not None:
            stats.ttfts.append(ttft(len(req.inp), res.hit_tokens, res.host_load_bytes))
        if tuner is not None:
            tuner.after_request(cache, req.inp, req.out, res)
        if check:
            cache.check_integrity()
    stats.finish_timing(start, cpu_start, tuner)
    return stats
