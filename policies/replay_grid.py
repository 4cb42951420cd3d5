"""Replaying a window of recorded requests from a cache snapshot, once per alpha of a grid.

The tuners (policies/tuners.py) score alphas this way. Everything here is a module-level
function of picklable arguments, so a grid can run inline, in forked worker processes
(`run_grid_parallel`) or in a background worker (policies/background.py).
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

from jenga_sglang.radix.cache import PrefixCache, ServeResult
from jenga_sglang.radix.tokens import TokenSeq

#: A recorded request: (input tokens, output tokens, namespace), replayed in its namespace
#: (None: the default one; radix/spaces.py) as the cache served it.
Recorded = tuple[TokenSeq, TokenSeq, str | None]


@contextmanager
def _deep_recursion() -> Iterator[None]:
    """pickle recurses once per tree level (node -> children -> node): allow deep trees."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 100_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def snapshot(cache: PrefixCache) -> bytes:
    """A restorable copy of the whole cache (tree, memory accounting, policy indexes)."""
    with _deep_recursion():
        return pickle.dumps(cache, protocol=pickle.HIGHEST_PROTOCOL)


def served_score(served: Sequence[ServeResult]) -> tuple[float, int]:
    """(FLOPs saved, tokens hit) of requests served, summed in the order `replay_score` uses."""
    saved, hits = 0.0, 0
    for result in served:
        saved += result.flops_saved
        hits += result.hit_tokens
    return saved, hits


def replay_score(snap: bytes, window: Sequence[Recorded], alpha: float) -> tuple[float, int]:
    """(FLOPs saved, tokens hit) by replaying `window` from `snap` with the given alpha."""
    with _deep_recursion():
        cache: PrefixCache = pickle.loads(snap)
    cache.eviction.alpha = alpha
    saved, hits = 0.0, 0
    for i, (inp, out, namespace) in enumerate(window):
        result = cache.serve(inp, out, owner=-1 - i, namespace=namespace)
        saved += result.flops_saved
        hits += result.hit_tokens
    return saved, hits


Scores = list[tuple[float, int]]
GridRunner = Callable[[bytes, Sequence[Recorded], Sequence[float]], Scores]


def run_grid_inline(snap: bytes, window: Sequence[Recorded], grid: Sequence[float]) -> Scores:
    return [replay_score(snap, window, a) for a in grid]


def run_grid_parallel(snap: bytes, window: Sequence[Recorded], grid: Sequence[float]) -> Scores:
    """The grid in worker processes (fork: the snapshot is shared, not re-sent per task)."""
    workers = max(1, min(len(grid), mp.cpu_count()))
    ctx = mp.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(replay_score, snap, window, a) for a in grid]
        return [f.result() for f in futures]


def grid_scores(
    runner: GridRunner,
    grid: Sequence[float],
    current: float,
    snap: bytes,
    window: Sequence[Recorded],
    served: Sequence[ServeResult | None],
) -> Scores:
    """One score per grid alpha: the served one for `current` if known, else replayed."""
    known: tuple[float, int] | None = None
    if len(served) == len(window) and None not in served:
        known = served_score([r for r in served if r is not None])
    todo = [a for a in grid if known is None or a != current]
    replayed = runner(snap, window, todo)
    if len(replayed) != len(todo):
        raise RuntimeError(f"{len(replayed)} scores for {len(todo)} alphas")
    by_alpha = dict(zip(todo, replayed, strict=True))
    return [known if a not in by_alpha and known is not None else by_alpha[a] for a in grid]
