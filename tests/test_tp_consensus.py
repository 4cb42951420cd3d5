"""SGLang's rank-consensus checker over our cache (binding/cache/tp_consensus.py), on two CPU ranks.

Two spawned processes join a gloo group, turn on SGLang's own checker
(``SGLANG_ENABLE_RANK_CONSENSUS_CHECKER=1``, `rank_consensus_checker.configure`) and drive a
`ConsensusJengaRadixCache` each over SGLang's CPU pools. Same calls: the checker stays quiet
and both ranks end with the same tree. One rank given another prompt: SGLang's checker sees
the divergence and ends both processes (exit status 1), so the marks are really compared.
The pool agreement (`agree_pool_budget`, `check_pool_agreed`) runs over the same group.
"""

from __future__ import annotations

import os
from array import array
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as tmp

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built"),
]

RANKS = 2
SHARED = [7 + (3 * i) % 50 for i in range(40)]


def _prompts(rank: int, diverge: bool) -> list[list[int]]:
    tail = 200 if diverge and rank == 1 else 100
    first = [*SHARED, 60, 61]
    return [first, SHARED + [tail + j for j in range(5)], [*first, 90, 91]]


def _drive(rank: int, diverge: bool) -> tuple[object, ...]:
    """Match, insert (with a state), evict: the calls SGLang's scheduler makes."""
    from sglang.srt.mem_cache import base_prefix_cache as bpc
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from test_binding_backend import _params

    from jenga_sglang.binding.cache.tp_consensus import ConsensusJengaRadixCache
    from jenga_sglang.binding.options import JengaOptions
    from jenga_sglang.models import get_spec

    params = _params(mamba=True, kv_size=256)
    cache = ConsensusJengaRadixCache(params, get_spec("nemotron-h-8b"), JengaOptions(enabled=True))
    allocator, req_pool = params.token_to_kv_pool_allocator, params.req_to_token_pool
    hits = []
    for tokens in _prompts(rank, diverge):
        hits.append(
            cache.match_prefix(
                bpc.MatchPrefixParams(key=RadixKey(array("q", tokens)))
            ).device_prefix_len
        )
        slots = allocator.alloc(len(tokens))
        state = req_pool.mamba_allocator.alloc(1)
        done = cache.insert(
            bpc.InsertParams(key=RadixKey(array("q", tokens)), value=slots, mamba_value=state)
        )
        allocator.free(slots[: done.prefix_len])
        if done.mamba_exist:
            req_pool.mamba_allocator.free(state)
    evicted = cache.evict(bpc.EvictParams(num_tokens=20))
    cache.sanity_check()
    return tuple(hits), evicted.num_tokens_evicted, cache.evictable_size()


def _rank(rank: int, store: str, diverge: bool, results: Any) -> None:
    os.environ["SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"] = "1"  # before SGLang reads it
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=RANKS)
    from sglang.srt.utils import rank_consensus_checker as checker

    from jenga_sglang.binding.cache.tp_consensus import agree_pool_budget

    checker.configure([SimpleNamespace(cpu_group=dist.group.WORLD)])
    try:
        budget = agree_pool_budget(1000 + rank, dist.group.WORLD)
        results[rank] = (*_drive(rank, diverge), budget)
        checker.shutdown()  # drains and compares what is left
    finally:
        dist.destroy_process_group()


def _run(tmp_path: Path, diverge: bool) -> tuple[list[int | None], dict[int, Any]]:
    ctx = tmp.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        procs = [
            ctx.Process(target=_rank, args=(r, str(tmp_path / "store"), diverge, results))
            for r in range(RANKS)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=240)
        for p in procs:
            if p.is_alive():
                p.kill()
        return [p.exitcode for p in procs], dict(results)


def test_same_calls_keep_the_checker_quiet_and_the_trees_equal(tmp_path: Path) -> None:
    codes, results = _run(tmp_path, diverge=False)
    assert codes == [0, 0]
    assert results[0] == results[1]
    hits, evicted, _, budget = results[0]
    assert hits == (0, 0, 42) and evicted > 0  # the tree was used: a state hit, an eviction
    assert budget == 1000  # the smallest rank's budget


def test_a_diverging_rank_stops_both(tmp_path: Path) -> None:
    codes, _ = _run(tmp_path, diverge=True)
    assert codes == [1, 1]  # SGLang's checker: os._exit(1) on every rank


def test_the_cpu_shim_turns_pynccl_off_only_where_the_caller_did_not_choose() -> None:
    from jenga_sglang.cpu_tensor_parallel import around_group_init

    def group_init(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return kwargs

    assert around_group_init(group_init, [[0, 1]], 0, "gloo", group_name="tp") == {
        "group_name": "tp",
        "use_pynccl": False,
    }
    assert around_group_init(group_init, use_pynccl=True)["use_pynccl"] is True
