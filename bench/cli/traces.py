"""``jenga-bench traces build <kind> [--out PATH] [params]``: build a trace file.

Every field of a kind's parameter dataclass (bench/traces/build.py `KINDS`) is a flag
(``--rate``, ``--article-len LO HI``...). Without ``--out`` the trace goes to the cache directory
(``data/traces/`` by default) under a name keyed by the kind and its parameters, and an existing
file there is reused unless ``--force`` is given.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jenga_sglang.bench.traces.build import DEFAULT_CACHE_DIR, KINDS, build_trace, cached_trace
from jenga_sglang.bench.traces.trace import write_trace


def add_traces_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``traces build <kind>`` to an argparse subparsers object; returns the traces parser."""
    traces: argparse.ArgumentParser = subparsers.add_parser("traces", help="build request traces")
    actions = traces.add_subparsers(dest="traces_command", required=True)
    build = actions.add_parser("build", help="build a trace file")
    kinds = build.add_subparsers(dest="kind", required=True)
    for kind, (cls, _) in KINDS.items():
        p = kinds.add_parser(kind, help=(cls.__doc__ or kind).splitlines()[0])
        p.add_argument("--out", type=Path, help="output file (.jsonl, .jsonl.gz, .jsonl.xz)")
        p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
        p.add_argument("--force", action="store_true", help="rebuild even if cached")
        _add_param_flags(p, cls)
        p.set_defaults(func=run_traces_build, params_cls=cls)
    return traces


def _add_param_flags(p: argparse.ArgumentParser, cls: type) -> None:
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        if isinstance(default, tuple):
            p.add_argument(flag, type=int, nargs=2, metavar=("LO", "HI"), default=default)
        elif default is None or isinstance(default, int):
            p.add_argument(flag, type=int, default=default)
        else:
            p.add_argument(flag, type=type(default), default=default)


def params_from_args(cls: type, args: argparse.Namespace) -> Any:
    values = {}
    for f in dataclasses.fields(cls):
        v = getattr(args, f.name)
        values[f.name] = tuple(v) if isinstance(v, list) else v
    return cls(**values)


def run_traces_build(args: argparse.Namespace) -> int:
    """Handler of ``traces build``: builds (or reuses) the trace and prints a summary."""
    t0 = time.perf_counter()
    try:
        params = params_from_args(args.params_cls, args)
        if args.out is not None:
            reqs, meta = build_trace(args.kind, params)
            write_trace(args.out, reqs, meta)
            path, stats = Path(args.out), meta["stats"]
        else:
            path = cached_trace(args.kind, params, args.cache_dir, args.force)
            stats = _read_meta(path).get("stats", {})
    except ValueError as e:  # bad parameters: say which, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    took = time.perf_counter() - t0
    print(f"{args.kind}: {path} ({took:.1f} s) {json.dumps(stats)}")
    return 0


def _read_meta(path: Path) -> dict[str, Any]:
    from jenga_sglang.bench.traces.trace import META_KEY, open_text

    with open_text(path, "r") as f:
        first = json.loads(f.readline() or "{}")
    meta: dict[str, Any] = first.get(META_KEY, {})
    return meta


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jenga-traces")
    add_traces_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
