"""Start and stop an SGLang server on loopback for the CPU end-to-end runs (docs/e2e-cpu.md).

The server runs in its own process group so that stopping it also stops the scheduler and
detokenizer processes it spawns; every wait is bounded, and a server that dies or never gets
ready raises `ServerError` with the tail of its log (bench/drivers/process.py).

Two Mamba cache strategies (`strategy=`), each with the scheduling SGLang allows it:

* ``no_buffer`` without overlap scheduling (what SGLang resolves on CPU by itself);
* ``extra_buffer`` with overlap scheduling (SGLang's GPU default). SGLang refuses it on CPU;
  the plugin allows it under the Triton interpreter (jenga_sglang/cpu_interpreter.py), and the
  server gets ``SGLANG_MAMBA_CONV_DTYPE=float32`` because SGLang's snapshot of the conv window
  writes the model's activations into the conv state by index, which needs equal dtypes
  (bf16 conv states by default; the tiny model runs in float32; docs/e2e-cpu.md).
"""

from __future__ import annotations

import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from jenga_sglang.bench.drivers.process import LoopbackProcess, ServerError, log_tail

__all__ = ["CPU_FLAGS", "STRATEGIES", "STRATEGY_ENV", "LocalServer", "ServerError", "free_port"]

# What SGLang 0.5.23 needs to serve a hybrid model on a CPU (docs/e2e-cpu.md has each reason).
CPU_FLAGS: tuple[str, ...] = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--disable-cuda-graph",
    "--dtype", "float32",
    "--skip-server-warmup",
    "--enable-cache-report",
    "--mem-fraction-static", "0.05",
    "--max-total-tokens", "4096",
)  # fmt: skip

STRATEGIES: dict[str, tuple[str, ...]] = {
    "no_buffer": ("--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"),
    "extra_buffer": ("--mamba-radix-cache-strategy", "extra_buffer"),  # overlap: SGLang's default
}
STRATEGY_ENV: dict[str, dict[str, str]] = {
    "no_buffer": {},
    "extra_buffer": {"SGLANG_MAMBA_CONV_DTYPE": "float32"},  # the model's dtype (see above)
}


# Ports a server binds only later come from under the kernel's ephemeral range: bind(0) and every
# outgoing connection draw from that range, and a port picked there by binding port 0 was taken by
# another socket before a slowly starting server bound it (seen twice on 2026-11-30: a TP server,
# then a PD prefill server in CI, whose uvicorn then exited with 3). SGLang picks its own later
# ports (NCCL's store among them) from 22000-29999, so ours stay below that.
_PORT_RANGE = (15000, 21999)
_handed_out: set[int] = set()  # this process never hands out a port twice


def free_port(tries: int = 64) -> int:
    """A loopback port that is free now and that a process may bind later (see above)."""
    import random

    low, high = _PORT_RANGE
    span = range(low, min(high, _ephemeral_low() - 1) + 1)
    for port in random.sample(span, min(tries, len(span))):
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise OSError(f"no free port in {low}-{high} after {tries} tries")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


class LocalServer(LoopbackProcess):
    """`python -m sglang.launch_server` on 127.0.0.1, as a context manager.

    >>> with LocalServer("data/tiny-model", ["--enable-jenga"], log=Path("out/s.log")) as s:
    ...     s.url  # 'http://127.0.0.1:<port>'

    `strategy` picks the Mamba cache strategy and its scheduling (`STRATEGIES`); `env` adds to
    the server's environment; `ready_line`: the server is ready once its log holds this text
    (for a `--grpc-mode` worker, which serves no HTTP), else once /v1/models answers; `port`:
    its port (default: a free one).
    """

    name = "server"

    def __init__(
        self,
        model: str,
        extra_flags: Sequence[str] = (),
        *,
        log: Path,
        ready_timeout_s: float = 600.0,
        strategy: str = "no_buffer",
        env: Mapping[str, str] | None = None,
        ready_line: str | None = None,
        port: int | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {sorted(STRATEGIES)}, got {strategy!r}")
        self.strategy = strategy
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready_line = ready_line  # ready once the log has it (a gRPC worker has no HTTP)
        argv = [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", model, "--host", "127.0.0.1", "--port", str(self.port),
            *CPU_FLAGS, *STRATEGIES[strategy], *extra_flags,
        ]  # fmt: skip
        # Triton kernels run in the interpreter
        server_env = {"TRITON_INTERPRET": "1", **STRATEGY_ENV[strategy], **(env or {})}
        super().__init__(argv, log=log, ready_timeout_s=ready_timeout_s, env=server_env)

    def _ready(self) -> bool:
        if self.ready_line is not None:
            return self.ready_line in log_tail(self.log, 1 << 22)
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, OSError):
            return False


def scrape_counters(url: str, names: Mapping[str, str]) -> dict[str, float]:
    """Counters off the server's Prometheus text at `url`/metrics, by key of `names` (key ->
    sample name), each summed over its label sets (ranks); 0 where absent."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as reply:
        return sum_samples(reply.read().decode(), names)


def sum_samples(text: str, names: Mapping[str, str]) -> dict[str, float]:
    """`scrape_counters` on Prometheus text. A name may select one label value, as in
    'sglang:cached_tokens_total{cache_source="host"}': only samples with that label count."""
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        for key, name in names.items():
            base, _, label = name.partition("{")
            selected = not label or label.rstrip("}") in line.split("}", 1)[0]
            if (line.startswith(base + "{") or line.startswith(base + " ")) and selected:
                out[key] += float(line.rsplit(" ", 1)[1])
    return out
