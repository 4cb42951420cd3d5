"""Alpha-tuning replays off the request path, adopted at a fixed point of the request stream.

A tuner that finishes a window submits its grid replay here and goes on serving; the scores
are adopted when the tuner has seen `lag` more requests, waiting for the worker only if it is
still busy then:

    request:   ... n (window ends: submit) ... n+1 ... n+lag (collect, adopt alpha) ...
    worker:        |---- replay of the grid from the snapshot ----|

Adopting at request n+lag and not "whenever the worker is done" keeps every tensor-parallel rank
on the same alpha at the same request: the replay is deterministic and the adoption point
depends only on the request count. A worker that raises, or dies (killed, out of memory),
yields its exception instead of scores; the tuner then keeps its alpha and logs it, and the
next submission gets a fresh worker.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jenga_sglang.policies.replay_grid import Scores

Job = Callable[[], "Scores"]


def _call(job: Job) -> Scores:
    return job()


class BackgroundReplay:
    """One replay at a time in a worker (a spawned process unless an executor is given)."""

    def __init__(
        self, lag: int = 64, executor_factory: Callable[[], Executor] | None = None
    ) -> None:
        if lag < 1:
            raise ValueError(f"lag must be >= 1 request, got {lag}")
        self.lag = lag
        self._factory = executor_factory or _spawned_worker
        self._executor: Executor | None = None
        self._future: Future[Scores] | None = None
        self._due = 0
        self.waited_s = 0.0  # time the request path spent waiting for a replay

    @property
    def busy(self) -> bool:
        return self._future is not None

    def submit(self, job: Job, seen: int) -> None:
        """Start `job` (picklable for a process worker); its result is due at `seen + lag`."""
        if self._future is not None:
            raise RuntimeError("a tuning replay is already running")
        if self._executor is None:
            self._executor = self._factory()
        self._future = self._executor.submit(_call, job)
        self._due = seen + self.lag

    def collect(self, seen: int) -> Scores | Exception | None:
        """None before the due request; then the scores, or the exception the worker raised."""
        if self._future is None or seen < self._due:
            return None
        future, self._future = self._future, None
        start = time.perf_counter()
        try:
            return future.result()
        except Exception as exc:  # BrokenProcessPool when the worker died
            self.close()
            return exc
        finally:
            self.waited_s += time.perf_counter() - start

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def _spawned_worker() -> Executor:
    # spawn, not fork: the server process holds threads and accelerator state.
    return ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
