"""`--enable-metrics` export of the jenga backend through SGLang's Prometheus machinery.

SGLang's scheduler exports with `prometheus_client` (multiprocess mode: each scheduler process
writes its own files, the HTTP server aggregates them), labelling every cache series with its
rank (`radix_cache_metric_labels`: cache_type, tp/pp/dp rank). We register our families once per
process in the same registry, with the labels of the cache's own `RadixCacheMetricsCollector`,
so `/metrics` lists them beside SGLang's `sglang:` cache series:

    jenga:hit_tokens_total              prefix tokens admitted requests reused from the tree
                                        (counter; once per admission, not per match)
    jenga:ssm_checkpoints_admitted_total  Mamba states the tree adopted (counter)
    jenga:ssm_checkpoints_evicted_total   Mamba states evicted (counter)
    jenga:eviction_alpha                current FLOP weight of the eviction order (gauge)
    jenga:pool_bytes{page_type, use}    bytes the tree holds per page type, used/evictable
    jenga:rewriting                     1 once requests usually rewrite their history (gauge)
    jenga:ghost_branch_points_total     plans that took their branch point from the ghost
                                        index: histories the tree had evicted (counter)
    jenga:inpass_captures_total         SSM checkpoints the prefill forward wrote in-pass
                                        (counter; binding/cache/captures.py)
    jenga:inpass_captures_lost_total    planned in-pass checkpoints not captured: no Mamba
                                        slot free, or a forward our hooks did not serve
    jenga:prefill_cuts_total            prefill chunks ended at a planned checkpoint instead
                                        (binding/capture/prefill_cut.py: one more prefill
                                        round each)
    jenga:prefill_held_back_total       admissions put off one round to hit a checkpoint
    jenga:shared_branches_total         in-batch branch points added to a request's captures
                                        another request captures (binding/capture/shared_prefill.py)
    jenga:hits_unseeded_total           hits not used: no Mamba slot could be freed to copy
                                        the hit's state into (every slot held by running
                                        requests; binding/cache/mamba_state.py)
    jenga:host_hit_tokens_total         hit tokens loaded back from the host tier
                                        (--jenga-host-gb; binding/host/)
    jenga:host_stored_bytes_total       bytes the tier copied device -> host (demotions)
    jenga:host_loaded_bytes_total       bytes it copied host -> device (load-backs)
    jenga:host_kept_bytes_total         bytes demoted onto a clean host copy, not copied
                                        again (radix/host_copy.py)
    jenga:host_loads_declined_total     load-backs SGLang asked for that loaded nothing: the
                                        checkpoint would take KV room the admission counted
    jenga:pool_bytes{page_type="host ..."}  bytes the tier holds in host memory per type

`sync(snapshot)` turns the backend's cumulative numbers into counter increments (deltas since
the previous sync), so the backend keeps plain ints on its hot path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_FAMILIES: dict[str, Any] = {}  # one registration per process, shared by every cache in it


@dataclass(frozen=True)
class Snapshot:
    """The backend's cumulative counters and current gauges at one moment."""

    hit_tokens: int
    states_admitted: int
    states_evicted: int
    alpha: float
    pool_bytes: dict[tuple[str, str], int]  # (page type, "used" | "evictable") -> bytes
    rewriting: bool = False
    ghost_branches: int = 0
    captures: int = 0
    captures_lost: int = 0
    prefill_cuts: int = 0
    held_back: int = 0
    shared_branches: int = 0
    unseeded: int = 0
    host_hit_tokens: int = 0  # of hit_tokens, loaded from the host tier (binding/host/)
    host_stored_bytes: int = 0
    host_loaded_bytes: int = 0
    host_kept_bytes: int = 0
    host_loads_declined: int = 0
    host_bytes: dict[tuple[str, str], int] = field(default_factory=dict)  # as pool_bytes


def _families() -> dict[str, Any]:
    if _FAMILIES:
        return _FAMILIES
    from prometheus_client import Counter, Gauge

    # Label names must be known at registration; SGLang's cache labels are fixed per release.
    names = ["cache_type", "tp_rank", "pp_rank", "dp_rank"]
    _FAMILIES.update(
        hit=Counter(
            "jenga:hit_tokens", "Prefix tokens admitted requests reused from the jenga tree", names
        ),
        admitted=Counter(
            "jenga:ssm_checkpoints_admitted", "Mamba states adopted by the jenga tree", names
        ),
        evicted=Counter(
            "jenga:ssm_checkpoints_evicted", "Mamba states evicted from the jenga tree", names
        ),
        alpha=Gauge(
            "jenga:eviction_alpha",
            "FLOP weight of the jenga eviction order",
            names,
            multiprocess_mode="mostrecent",
        ),
        pool=Gauge(
            "jenga:pool_bytes",
            "Bytes the jenga tree holds, by page type and use",
            [*names, "page_type", "use"],
            multiprocess_mode="mostrecent",
        ),
        rewriting=Gauge(
            "jenga:rewriting",
            "1 once requests usually leave the sequence they extend mid-way (agents)",
            names,
            multiprocess_mode="mostrecent",
        ),
        ghost=Counter(
            "jenga:ghost_branch_points",
            "Checkpoint plans that took their branch point from the ghost index",
            names,
        ),
        captures=Counter(
            "jenga:inpass_captures", "SSM checkpoints written by the prefill forward", names
        ),
        captures_lost=Counter(
            "jenga:inpass_captures_lost",
            "Planned in-pass checkpoints not captured (no slot free, or forward not served)",
            names,
        ),
        cuts=Counter(
            "jenga:prefill_cuts",
            "Prefill chunks ended at a planned checkpoint (one more prefill round each)",
            names,
        ),
        held_back=Counter(
            "jenga:prefill_held_back",
            "Admissions put off one round to hit a checkpoint another request captures",
            names,
        ),
        shared_branches=Counter(
            "jenga:shared_branches",
            "Branch points of two requests admitted together, captured by the first",
            names,
        ),
        unseeded=Counter(
            "jenga:hits_unseeded",
            "Hits not used: no Mamba slot could be freed to copy the hit's state into",
            names,
        ),
        host_hit=Counter(
            "jenga:host_hit_tokens", "Hit tokens loaded back from the host tier", names
        ),
        host_stored=Counter(
            "jenga:host_stored_bytes", "Bytes copied device -> host by the host tier", names
        ),
        host_loaded=Counter(
            "jenga:host_loaded_bytes", "Bytes copied host -> device by the host tier", names
        ),
        host_kept=Counter(
            "jenga:host_kept_bytes",
            "Bytes demoted onto a clean host copy left by a load-back: not copied again",
            names,
        ),
        host_declined=Counter(
            "jenga:host_loads_declined",
            "Load-backs that loaded nothing: the checkpoint would take KV room the admission "
            "counted on",
            names,
        ),
    )
    return _FAMILIES


class JengaMetrics:
    """Series of one cache (one scheduler rank); `labels` come from SGLang's cache collector."""

    LABELS = ("cache_type", "tp_rank", "pp_rank", "dp_rank")

    def __init__(self, labels: dict[str, Any]) -> None:
        missing = [k for k in self.LABELS if k not in labels]
        if missing:
            raise ValueError(f"metric labels lack {missing} (got {sorted(labels)})")
        self.labels = {k: str(labels[k]) for k in self.LABELS}
        self.families = _families()
        self._last = Snapshot(0, 0, 0, 0.0, {})

    def sync(self, now: Snapshot) -> None:
        fam, last, lab = self.families, self._last, self.labels
        for key, new, old in (
            ("hit", now.hit_tokens, last.hit_tokens),
            ("admitted", now.states_admitted, last.states_admitted),
            ("evicted", now.states_evicted, last.states_evicted),
            ("ghost", now.ghost_branches, last.ghost_branches),
            ("captures", now.captures, last.captures),
            ("captures_lost", now.captures_lost, last.captures_lost),
            ("cuts", now.prefill_cuts, last.prefill_cuts),
            ("held_back", now.held_back, last.held_back),
            ("shared_branches", now.shared_branches, last.shared_branches),
            ("unseeded", now.unseeded, last.unseeded),
            ("host_hit", now.host_hit_tokens, last.host_hit_tokens),
            ("host_stored", now.host_stored_bytes, last.host_stored_bytes),
            ("host_loaded", now.host_loaded_bytes, last.host_loaded_bytes),
            ("host_kept", now.host_kept_bytes, last.host_kept_bytes),
            ("host_declined", now.host_loads_declined, last.host_loads_declined),
        ):
            if new > old:
                fam[key].labels(**lab).inc(new - old)
        fam["alpha"].labels(**lab).set(now.alpha)
        fam["rewriting"].labels(**lab).set(int(now.rewriting))
        for (ptype, use), nbytes in {**now.pool_bytes, **now.host_bytes}.items():
            fam["pool"].labels(**lab, page_type=ptype, use=use).set(nbytes)
        self._last = now
