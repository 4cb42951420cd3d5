"""Tensor-parallel ranks adopt the leader's tuning outcome (binding/cache/tp_share.py), over a real
two-process gloo group on CPU: same alphas at the same requests, only the leader replays, and a
replay that fails on the leader is a failure on every rank."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as tmp
from test_background_tuning import _cache
from test_policies import chat_trace, serve_all

from jenga_sglang.binding.cache.tp_share import GroupShare, share_channel
from jenga_sglang.policies.background import BackgroundReplay
from jenga_sglang.policies.replay_grid import Recorded, Scores, run_grid_inline
from jenga_sglang.policies.tuners import SlidingTuner

RANKS = 2


def _failing_runner(snap: bytes, window: Sequence[Recorded], grid: Sequence[float]) -> Scores:
    raise MemoryError("replay ran out of memory")


def _rank(rank: int, store: str, fail: bool, results: dict[int, object]) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=RANKS)
    try:
        channel = share_channel(dist.group.WORLD)
        assert isinstance(channel, GroupShare) and channel.leader == (rank == 0)
        workers: list[int] = []

        def factory() -> Executor:
            workers.append(rank)
            return ThreadPoolExecutor(max_workers=1)

        runner = _failing_runner if fail else run_grid_inline
        background = BackgroundReplay(2, executor_factory=factory, channel=channel)
        tuner = SlidingTuner(window=4, pause=2, max_pause=8, runner=runner, background=background)
        cache = _cache()
        cache.eviction.alpha = 0.5
        hits = serve_all(cache, tuner, chat_trace(6, 10))
        cache.check_integrity()
        background.close()
        results[rank] = (hits, tuner.log.history, tuner.log.failures, cache.eviction.alpha, workers)
    finally:
        dist.destroy_process_group()


def _run_ranks(tmp_path: Path, fail: bool) -> dict[int, object]:
    ctx = tmp.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        procs = [
            ctx.Process(target=_rank, args=(r, str(tmp_path / "store"), fail, results))
            for r in range(RANKS)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0] * RANKS
        return dict(results)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")
def test_ranks_adopt_the_leaders_alphas_and_only_the_leader_replays(tmp_path: Path) -> None:
    results = _run_ranks(tmp_path, fail=False)
    lone = SlidingTuner(window=4, pause=2, max_pause=8, background=_lone_worker())
    cache = _cache()
    cache.eviction.alpha = 0.5
    hits = serve_all(cache, lone, chat_trace(6, 10))
    leader, follower = results[0], results[1]
    assert isinstance(leader, tuple) and isinstance(follower, tuple)
    assert len(leader[1]) >= 2  # it re-tuned more than once
    assert leader[:4] == follower[:4] == (hits, lone.log.history, 0, cache.eviction.alpha)
    assert leader[4] == [0] and follower[4] == []  # one worker, on the leader only


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")
def test_a_replay_failing_on_the_leader_fails_on_every_rank(tmp_path: Path) -> None:
    results = _run_ranks(tmp_path, fail=True)
    for rank in range(RANKS):
        _, history, failures, alpha, _ = results[rank]  # type: ignore[misc]
        assert history == [] and failures >= 2 and alpha == 0.5


def test_no_channel_without_a_process_group() -> None:
    assert not dist.is_initialized()
    assert share_channel(None) is None


def _lone_worker() -> BackgroundReplay:
    return BackgroundReplay(2, executor_factory=lambda: ThreadPoolExecutor(max_workers=1))
