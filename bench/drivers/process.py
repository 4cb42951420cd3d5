"""A command on loopback in its own process group, as a context manager (the SGLang server,
the smg router).

Started with its output in a log file; ready once `_ready()` says so, polled every 2 s for at
most `ready_timeout_s`; stopped by its PID's process group, so the processes it spawns go with
it (SIGTERM, SIGKILL after a grace period). A process that exits or never gets ready raises
`ServerError` quoting the tail of its log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self


class ServerError(RuntimeError):
    """The process exited or did not become ready in time (the message quotes its log)."""


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


class LoopbackProcess:
    """`argv` run with `env` added to this process's environment (module doc). Subclasses say
    when it is ready (`_ready`) and what it is called in errors (`name`)."""

    name = "process"

    def __init__(
        self, argv: Sequence[str], *, log: Path, ready_timeout_s: float, env: Mapping[str, str]
    ) -> None:
        self.argv = list(argv)
        self.log = log
        self.ready_timeout_s = ready_timeout_s
        self.env = dict(env)
        self._proc: subprocess.Popen[bytes] | None = None

    def _ready(self) -> bool:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as sink:
            self._proc = subprocess.Popen(
                self.argv,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        """The launcher's PID, which leads its process group (None once stopped)."""
        return None if self._proc is None else self._proc.pid

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ServerError(
                    f"{self.name} exited with {self._proc.returncode} before it was ready; log "
                    f"{self.log}:\n{log_tail(self.log)}"
                )
            if self._ready():
                return
            time.sleep(2)
        raise ServerError(
            f"{self.name} not ready after {self.ready_timeout_s:.0f} s; log {self.log}:\n"
            f"{log_tail(self.log)}"
        )

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL after `grace_s`; idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=wait_s)
        # Children that outlived the launcher (one that died on its own included) are still in
        # its process group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
