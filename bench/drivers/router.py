"""Start and stop smg (the SGLang model gateway, PyPI `smg`) on loopback in front of workers.

    with LocalRouter(["grpc://127.0.0.1:A", "grpc://127.0.0.1:B"], "cache_aware",
                     model="data/tiny-model", log=Path("out/router.log")) as router:
        router.url  # 'http://127.0.0.1:<port>': OpenAI-compatible, what `jenga-bench online` takes

The router runs in its own process group (stopped with it, by its PID), with debug logging:
its event-driven cache-aware policy logs, per request, how many of the request's blocks it
found in the chosen worker's index (`predicted_hits` reads them back). Every wait is bounded; a
router that exits or never lists every worker as healthy raises `ServerError` with its log's tail.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from jenga_sglang.bench.drivers.process import LoopbackProcess
from jenga_sglang.bench.drivers.server import free_port

POLICIES = ("cache_aware", "round_robin")


class LocalRouter(LoopbackProcess):
    """`python -m smg.launch_router` on 127.0.0.1 over `workers`, as a context manager."""

    name = "router"

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
        self.worker_count = len(workers)
        argv = [
            sys.executable, "-m", "smg.launch_router",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", *workers,
            "--policy", policy,
            "--model-path", model,  # the router tokenizes for gRPC workers
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
            "--log-level", "debug",
            *extra_flags,
        ]  # fmt: skip
        super().__init__(argv, log=log, ready_timeout_s=ready_timeout_s, env={"NO_COLOR": "1"})

    def _ready(self) -> bool:
        """Every worker registered and healthy: smg answers once its first worker is, and
        requests sent then all go to that one (a run's first turns batched on one replica)."""
        try:
            with urllib.request.urlopen(f"{self.url}/workers", timeout=5) as reply:
                listed = json.loads(reply.read()).get("workers") or []
        except (urllib.error.URLError, OSError, ValueError):
            return False
        ready = [w for w in listed if w.get("is_healthy") and w.get("status") == "ready"]
        return len(ready) >= self.worker_count
