"""`jenga-bench` subcommands for the studies that parse their own flags.

Each study module keeps its `main(argv)` (its flags, help and exit status live beside the code
they drive); these subcommands hand it everything after the subcommand's name, so
`jenga-bench fragmentation --help` prints the study's own help. The module is imported only
when its subcommand runs: `kernels` must start on a GPU machine without SGLang, and the
pure-Python studies never load torch.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

#: subcommand -> (module under jenga_sglang.bench.studies, one-line help)
STUDIES: dict[str, tuple[str, str]] = {
    "fragmentation": ("fragmentation", "internal fragmentation of the Jenga pool over time"),
    "eviction": ("eviction_bench", "evictions per second against the tree size"),
    "kernels": ("kernel_bench", "in-pass SSM capture cost (GPU), or a CPU smoke run"),
    "agent-bounds": ("agent_bounds", "session-level bounds of any policy over LRU"),
    "policy-targets": ("policy_targets", "bundles vs the per-configuration oracle"),
    "e2e-cpu": ("e2e_cpu", "the tiny model served on CPU, stock and --enable-jenga"),
    "sessions-cpu": ("sessions_cpu", "SGLang's session radix cache against jenga, on CPU"),
    "e2e-models": ("e2e_models", "every tiny model family served on CPU, stock and jenga"),
    "bench-serving": ("bench_serving_cpu", "SGLang's bench_serving against the tiny model"),
    "demo-serve": ("demo_serve", "the serving half of `make demo`"),
    "scale-tp": ("scale_tp", "--tp-size 2 on CPU, stock and jenga, rank-consensus checker on"),
    "scale-dp": ("scale_dp", "two replicas behind smg: cache-aware vs round robin, jenga vs stock"),
    "window-events": ("window_events", "a sliding-window worker's KV events against its hits"),
    "speculative-cpu": ("speculative_cpu", "speculative decoding on CPU, stock and jenga"),
    "pd-cpu": ("pd_cpu", "prefill-decode disaggregation on CPU, stock and jenga"),
    "reply-trace": ("reply_trace", "one sessions-cpu reply, by cached prefix and from host"),
}


def add_study_parsers(sub: Any) -> None:
    for name, (module, text) in STUDIES.items():
        p = sub.add_parser(name, help=text, add_help=False, prefix_chars="\0")
        p.add_argument("argv", nargs=argparse.REMAINDER)
        p.set_defaults(func=_runner(module))


def _runner(module: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        study = importlib.import_module(f"jenga_sglang.bench.studies.{module}")
        code = study.main(list(args.argv))
        return int(code or 0)

    return run
