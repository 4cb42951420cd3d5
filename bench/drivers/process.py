"""A command on loopback in its own process group, as a context manager (the SGLang server,
the smg router).

Started with its output in a log file; ready once `_ready()` says so, polled every 2 s for at
most `ready_timeout_s`; stopped by its PID's process group, so the processes it spawns go with
it (SIGTERM, SIGKILL after a grace period). A process that exits or never gets ready raises
`ServerError` quoting the tail of its log.

Each runs in a session of its own, so a signal to the caller's process group does not reach
it: while one is held, SIGTERM to the caller raises `SystemExit` (if nothing else handles
SIGTERM there), so the `with` blocks unwind and stop it, as they do on Ctrl-C. A study killed
by `kill` or `timeout` leaves no server behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
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


class _SigtermExits:
    """SIGTERM raises SystemExit while at least one loopback process is held (module doc).
    Only on the main thread, and only where SIGTERM had its default action."""

    def __init__(self) -> None:
        self.held = 0
        self.installed = False

    def hold(self) -> None:
        self.held += 1
        main = threading.current_thread() is threading.main_thread()
        if self.held == 1 and main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _exit)
            self.installed = True

    def release(self) -> None:
        self.held -= 1
        if self.held == 0 and self.installed:
            if signal.getsignal(signal.SIGTERM) is _exit:  # not if someone replaced it since
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self.installed = False


def _exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


_SIGTERM = _SigtermExits()


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
        _SIGTERM.hold()  # released by stop()
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
        try:
            for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
                if proc.poll() is not None:
                    break
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=wait_s)
        finally:  # a second SIGTERM during the grace period ends it here
            # Children that outlived the launcher (one that died on its own included) are
            # still in its process group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            _SIGTERM.release()
