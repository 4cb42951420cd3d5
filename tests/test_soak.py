"""bench/studies/soak.py's pieces that need no server: RSS of a process group, percentiles,
prompts."""

from __future__ import annotations

import os
import random

from jenga_sglang.bench.studies.soak import HEAD_LEN, VOCAB, _pct, _prompt, group_rss_mb


def test_group_rss_counts_this_process_group() -> None:
    assert group_rss_mb(os.getpgrp()) > 10  # at least this interpreter
    assert group_rss_mb(2**22 + 17) == 0  # no such group


def test_percentiles_and_prompts_share_heads() -> None:
    assert _pct([], 0.5) is None
    assert _pct([3.0, 1.0, 2.0], 0.5) == 2.0 and _pct([1.0, 2.0], 0.99) == 2.0
    rng = random.Random(0)
    a, b, c = _prompt(rng, 1), _prompt(rng, 5), _prompt(rng, 2)
    assert a[:HEAD_LEN] == b[:HEAD_LEN] != c[:HEAD_LEN]  # index % 4 picks the head
    assert a != b and all(0 <= t < VOCAB for t in a + b + c)


def test_known_startup_traceback_is_not_counted() -> None:
    from jenga_sglang.bench.drivers.faults import unexpected_tracebacks

    known = "[t] post-warmup freeze_gc failed\nTraceback (a)\n  x\nTraceback (b)\n[t] ready\n"
    assert unexpected_tracebacks(known) == 0
    assert unexpected_tracebacks(known + "Traceback (c)\n") == 1
    assert unexpected_tracebacks(known.replace("post-warmup freeze_gc failed", "boom")) == 2
