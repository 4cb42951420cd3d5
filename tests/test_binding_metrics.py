"""`--enable-metrics`: the backend's Prometheus series move with SGLang's calls (no server).

The cache is built with `CacheInitParams(enable_metrics=True)`, as SGLang's scheduler builds it;
values are read back from prometheus_client's registry, where SGLang's exporter reads them.
"""

from __future__ import annotations

import dataclasses
from array import array
from typing import Any

import pytest

from tests.mamba_session import Session, load_sg, tokens

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def sg() -> Any:
    return load_sg()


def _value(name: str, labels: dict[str, str]) -> float:
    from prometheus_client import REGISTRY

    got = REGISTRY.get_sample_value(name, labels)
    return 0.0 if got is None else got


def _metered(sg: Any) -> Session:
    """A session whose cache exports metrics, as rank 0 of a one-GPU scheduler."""
    from sglang.srt.runtime_context import get_parallel

    from jenga_sglang.binding.cache.backend import JengaRadixCache

    s = Session(sg)
    params = dataclasses.replace(s.cache_params, enable_metrics=True)
    # A scheduler process publishes its ranks; here we state them for the collector's labels.
    with get_parallel().override(tp_rank=0, pp_rank=0, attn_tp_rank=0, attn_dp_rank=0):
        s.cache = JengaRadixCache(params, s.cache.spec, s.cache.options)
    return s


def test_series_move_with_admitted_hits_checkpoints_and_evictions(sg: Any) -> None:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    s = _metered(sg)
    labels = s.cache.metrics.labels
    hit0 = _value("jenga:hit_tokens_total", labels)
    adm0 = _value("jenga:ssm_checkpoints_admitted_total", labels)
    ev0 = _value("jenga:ssm_checkpoints_evicted_total", labels)
    a = tokens(0, 80)
    s.serve(a, [1, 2])
    state = str(s.cache.state_type)
    state_bytes = s.cache.spec.state_bytes
    assert _value("jenga:ssm_checkpoints_admitted_total", labels) == adm0 + 1
    pool = {**labels, "page_type": state, "use": "evictable"}
    assert _value("jenga:pool_bytes", pool) == state_bytes
    # SGLang matches a waiting request again every scheduling round; only its admission
    # (the prefix read into its row) reuses the tree, so only that counts as hit tokens
    waiting = sg.Req(
        rid="waiting",
        origin_input_text="",
        origin_input_ids=array("q", [*a, 1, 2, 3]),
        sampling_params=sg.SamplingParams(temperature=0, max_new_tokens=1),
    )
    for _ in range(5):  # five rounds in the queue
        waiting.init_next_round_input(s.cache)
    assert int(waiting.prefix_len) == 81
    assert _value("jenga:hit_tokens_total", labels) == hit0
    hit, _ = s.serve([*a, 1, 2, 3], [4])  # admitted once
    assert hit == 81
    assert _value("jenga:hit_tokens_total", labels) == hit0 + 81
    s.cache.evict(EvictParams(num_tokens=10_000, mamba_num=10))
    assert _value("jenga:ssm_checkpoints_evicted_total", labels) == ev0 + 2
    assert _value("jenga:pool_bytes", pool) == 0
    kv = {**labels, "page_type": str(s.cache.kv_type), "use": "evictable"}
    assert _value("jenga:pool_bytes", kv) == 0
    assert _value("jenga:eviction_alpha", labels) == s.cache.cache.eviction.alpha


def test_rewriting_and_ghost_branch_points_are_exported(sg: Any) -> None:
    """The backend's snapshot carries the admission's rewrite mode and ghost branch points,
    and the exporter publishes them (a second metered cache cannot be built in one process:
    SGLang's own collector registers once, so this one syncs by hand)."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    from jenga_sglang.binding.cache.metrics import JengaMetrics

    s = Session(sg, admission="jenga")
    admission = s.cache.cache.admission
    admission.min_samples, admission.min_branch_tokens = 1, 0  # one rewrite is enough here
    a = tokens(0, 80)
    s.serve(a, [1, 2])
    assert not s.cache.snapshot().rewriting
    b = a[:40] + tokens(5, 20, base=60)
    s.serve(b, [3, 4], cut_at=40)  # leaves a at 40: rewrites are now the common case
    s.cache.evict(EvictParams(num_tokens=10**6, mamba_num=10**6))
    s.serve(b[:50] + tokens(2, 10, base=90), [7, 8])  # leaves the evicted b at 50
    snap = s.cache.snapshot()
    assert snap.rewriting and snap.ghost_branches == 1
    labels = {"cache_type": "JengaRadixCache", "tp_rank": "7", "pp_rank": "0", "dp_rank": "0"}
    JengaMetrics(labels).sync(snap)
    assert _value("jenga:rewriting", labels) == 1
    assert _value("jenga:ghost_branch_points_total", labels) == 1


def test_families_registered_once_per_process(sg: Any) -> None:
    """A second cache in the process (SGLang builds one per scheduler) reuses the families."""
    from jenga_sglang.binding.cache.metrics import JengaMetrics

    labels = {"cache_type": "JengaRadixCache", "tp_rank": 1, "pp_rank": 0, "dp_rank": 0}
    first, second = JengaMetrics(labels), JengaMetrics(labels)  # a re-registration would raise
    assert first.families is second.families
    with pytest.raises(ValueError, match="dp_rank"):
        JengaMetrics({"cache_type": "x", "tp_rank": 0, "pp_rank": 0})
