"""Sweeps: every trace x cache size x policy, in parallel over all cores.

Traces are loaded and packed once in the parent (`runner.preload`, itself in parallel) before
the worker pool forks, so workers share them copy-on-write and a task carries only its small
`RunConfig`.
Records stream back as runs finish (JSON lines or CSV), with a tqdm progress bar on stderr.
Alpha tuning runs inline inside each worker: the sweep already keeps every core busy.
"""

from __future__ import annotations

import csv
import json
import multiprocessing as mp
import os
import sys
import traceback
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

from jenga_sglang.bench.runs.runner import RunConfig, preload, run, validate

#: Rough relative cost of a run per policy: start the slow ones first so no core idles at the end.
_WEIGHT = {"jenga": 3, "vllm-blocks": 2, "marconi": 1}


def grid(
    traces: Sequence[str],
    model: str,
    cache_gbs: Sequence[float],
    policies: Sequence[str],
    **common: Any,
) -> list[RunConfig]:
    """Every trace x cache size x policy; `common` holds the other RunConfig fields."""
    configs = [
        RunConfig(trace=t, model=model, cache_gb=gb, policy=p, **common)
        for t in traces
        for gb in cache_gbs
        for p in policies
    ]
    for config in configs:
        validate(config)
    return configs


def _work(config: RunConfig) -> dict[str, Any]:
    """One run in a worker; a failure becomes a record with an `error` field, not a dead pool."""
    try:
        return run(config)
    except Exception as exc:  # reported in the record, the sweep goes on
        return {
            "trace": config.trace,
            "model": config.model,
            "cache_gb": config.cache_gb,
            "policy": config.policy,
            "mode": config.mode,
            "memory": config.memory,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(limit=5),
        }


def sweep(
    configs: Sequence[RunConfig], jobs: int | None = None, progress: bool = True
) -> Iterator[dict[str, Any]]:
    """Run every config; yields records in completion order."""
    from tqdm import tqdm

    ordered = sorted(configs, key=lambda c: -_WEIGHT.get(c.policy, 0))
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(ordered)))
    preload([c.trace for c in configs], jobs)  # in the parent, before the fork
    bar = tqdm(total=len(ordered), file=sys.stderr, disable=not progress, unit="run")
    try:
        if jobs == 1:
            for config in ordered:
                yield _work(config)
                bar.update()
            return
        with mp.get_context("fork").Pool(jobs) as pool:
            for record in pool.imap_unordered(_work, ordered, chunksize=1):
                yield record
                bar.update()
    finally:
        bar.close()


def scalar_fields(record: dict[str, Any]) -> dict[str, Any]:
    """The fields of a record that fit a CSV cell (lists and timelines dropped)."""
    return {k: v for k, v in record.items() if isinstance(v, str | int | float | bool)}


def write_records(records: Iterable[dict[str, Any]], out: TextIO, fmt: str) -> list[dict[str, Any]]:
    """Stream records to `out` as JSON lines ("json") or CSV ("csv"); returns them too."""
    kept: list[dict[str, Any]] = []
    writer: csv.DictWriter[str] | None = None
    for record in records:
        kept.append(record)
        if fmt == "json":
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
        else:
            row = scalar_fields(record)
            if writer is None:
                writer = csv.DictWriter(out, fieldnames=list(row), extrasaction="ignore")
                writer.writeheader()
            writer.writerow(row)
        out.flush()
    return kept
