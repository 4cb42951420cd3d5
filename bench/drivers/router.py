"""Start and stop smg (the SGLang model gateway, PyPI `smg`) on loopback in front of workers.

    with LocalRouter(["grpc://127.0.0.1:A", "grpc://127.0.0.1:B"], "cache_aware",
                     model="data/tiny-model", log=Path("out/router.log")) as router:
        router.url  # 'http://127.0.0.1:<port>': OpenAI-compatible, what `jenga-bench online` takes

The router runs in its own process group (stopped with it, by its PID), with debug logging:
its event-driven cache-aware policy logs, per request, how many of the request's blocks it
found in the chosen worker's index (`predicted_hits` reads them back). Every wait is bounded; a
router that exits or never lists a model raises `ServerError` with its log's tail.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from jenga_sglang.bench.drivers.server import ServerError, _log_tail, free_port

POLICIES = ("cache_aware", "round_robin")


class LocalRouter:
    """`python -m smg.launch_router` on 127.0.0.1 over `workers`, as a context manager."""

    def __init__(
        self,
        workers: Sequence[str],
        policy: str,
        *,
        model: str,
        log: Path,
        ready_timeout_s: float = 300.0,
        extra_flags: Sequence[str] = (),
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log, self.ready_timeout_s = log, ready_timeout_s
        self.argv = [
            sys.executable, "-m", "smg.launch_router",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", *workers,
            "--policy", policy,
            "--model-path", model,  # the router tokenizes for gRPC workers
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
            "--log-level", "debug",
            *extra_flags,
        ]  # fmt: skip
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalRouter:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "NO_COLOR": "1"}
        with self.log.open("wb") as sink:
            self._proc = subprocess.Popen(
                self.argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
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

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ServerError(
                    f"router exited with {self._proc.returncode}; log {self.log}:\n"
                    f"{_log_tail(self.log)}"
                )
            if self._models():
                return
            time.sleep(2)
        raise ServerError(f"router not ready; log {self.log}:\n{_log_tail(self.log)}")

    def _models(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as reply:
                return bool(json.loads(reply.read()).get("data"))
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the router's process group, SIGKILL after `grace_s`; idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
