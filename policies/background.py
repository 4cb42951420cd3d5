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

Determinism alone does not cover a worker that fails on one rank only. With a `ShareChannel`
(the server passes one over SGLang's TP group) only the leader rank replays, and at the due
request every rank takes the leader's outcome, scores or failure alike:

    leader:    submit -> worker replays ----------> collect -> share(outcome) --> adopt
    follower:  submit (records the due request) --> collect -> share(None) -----> adopt
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from jenga_sglang.policies.replay_grid import Scores

Job = Callable[[], "Scores"]


def _call(job: Job) -> Scores:
    return job()


class ShareChannel(Protocol):
    """Gives every rank the leader's tuning outcome (a collective call: all ranks make it)."""

    @property
    def leader(self) -> bool:
        """True on the one rank that runs the replays."""
        ...

    def share(self, outcome: Scores | Exception | None) -> Scores | Exception:
        """The leader passes its outcome, the others None; every rank gets the leader's."""
        ...


class _Followed:
    """Stands for the leader's replay on a follower rank: nothing runs here."""


class BackgroundReplay:
    """One replay at a time in a worker (a spawned process unless an executor is given)."""

    def __init__(
        self,
        lag: int = 64,
        executor_factory: Callable[[], Executor] | None = None,
        channel: ShareChannel | None = None,
    ) -> None:
        if lag < 1:
            raise ValueError(f"lag must be >= 1 request, got {lag}")
        self.lag = lag
        self._factory = executor_factory or _spawned_worker
        self.channel = channel
        self._executor: Executor | None = None
        self._future: Future[Scores] | _Followed | None = None
        self._due = 0
        self.waited_s = 0.0  # time the request path spent waiting for a replay

    @property
    def replays_here(self) -> bool:
        """False on a follower rank: it adopts the leader's outcome and replays nothing."""
        return self.channel is None or self.channel.leader

    @property
    def busy(self) -> bool:
        return self._future is not None

    def submit(self, job: Job, seen: int) -> None:
        """Start `job` (picklable for a process worker); its result is due at `seen + lag`."""
        if self._future is not None:
            raise RuntimeError("a tuning replay is already running")
        self._due = seen + self.lag
        if not self.replays_here:
            self._future = _Followed()
            return
        if self._executor is None:
            self._executor = self._factory()
        self._future = self._executor.submit(_call, job)

    def collect(self, seen: int) -> Scores | Exception | None:
        """None before the due request; then the scores, or the exception the worker raised."""
        if self._future is None or seen < self._due:
            return None
        future, self._future = self._future, None
        start = time.perf_counter()
        try:
            outcome = None if isinstance(future, _Followed) else self._result(future)
            if self.channel is None:
                assert outcome is not None
                return outcome
            return self.channel.share(outcome)
        finally:
            self.waited_s += time.perf_counter() - start

    def _result(self, future: Future[Scores]) -> Scores | Exception:
        try:
            return future.result()
        except Exception as exc:  # BrokenProcessPool when the worker died
            self.close()
            return exc

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def _spawned_worker() -> Executor:
    # spawn, not fork: the server process holds threads and accelerator state.
    return ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
