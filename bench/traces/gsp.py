"""SGLang's generated-shared-prefix workload (``bench_serving --dataset-name
generated-shared-prefix``) as a trace, built by SGLang's own generator at run time.

``sglang.benchmark.datasets.generated_shared_prefix.sample_generated_shared_prefix_requests`` is
called with token-id prompts (its ``--tokenize-prompt`` mode): ``groups`` random system prompts
of ``system_prompt_len`` ids, each followed by its own random question of ``question_len`` ids,
``prompts_per_group`` questions per group slot, shuffled. Group popularity is SGLang's too:
``uniform`` gives every group exactly ``prompts_per_group`` requests, ``zipf`` draws each
request's group by rank with probability proportional to 1 / rank ** ``zipf_alpha``.

What this module adds around it, and why:

* the vocabulary: SGLang draws ids from ``tokenizer.get_vocab()``; :class:`MistralVocab` gives it
  the vocabulary of the Mistral v3 tokenizer file the ShareGPT builder reads (32,768 ids, no hub
  access). The tiny model's tokenizer would do too, but its 512 ids make accidental shared
  prefixes between unrelated prompts far likelier than with a real vocabulary;
* seeding: SGLang's generator draws from the global ``random`` / ``numpy.random`` state, which
  ``bench_serving`` seeds with ``--seed``; we seed both the same way and restore them after;
* SGLang's on-disk pickle cache (under ``~/.cache/sglang``) is bypassed with
  ``send_routing_key=True``, which also labels every row with its group (the key ends in the
  group index): the trace cache (``traces_cli.cached_trace``) is the one cache;
* output ids (SGLang only gives a length) and Poisson arrival times at ``rate`` requests per
  second, from our own seeded generator, as ``bench_serving``'s ``--request-rate`` would send
  them. Each request is its own session (turn 0), as in ``synthetic.system_chat``.
"""

from __future__ import annotations

import contextlib
import random
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from jenga_sglang.bench.traces.synthetic import make_rng, poisson_times, random_tokens
from jenga_sglang.bench.traces.trace import Request, sort_requests

POPULARITY = ("uniform", "zipf")


@dataclass(frozen=True, slots=True)
class GSPParams:
    """SGLang's generated-shared-prefix workload (its generator, token-id prompts)."""

    groups: int = 50
    prompts_per_group: int = 10
    system_prompt_len: int = 10240
    question_len: int = 256
    output_len: int = 128
    popularity: str = "uniform"
    zipf_alpha: float = 1.1
    range_ratio: float = 1.0
    rate: float = 2.0
    seed: int = 42

    def __post_init__(self) -> None:
        if self.popularity not in POPULARITY:
            raise ValueError(f"popularity must be one of {POPULARITY}, got {self.popularity!r}")
        if self.groups < 1 or self.prompts_per_group < 1:
            raise ValueError(
                f"need groups, prompts_per_group >= 1: {self.groups}, {self.prompts_per_group}"
            )
        if min(self.system_prompt_len, self.question_len) < 1 or self.output_len < 0:
            raise ValueError("need system_prompt_len, question_len >= 1 and output_len >= 0")
        if not self.zipf_alpha > 0:
            raise ValueError(f"zipf_alpha must be > 0, got {self.zipf_alpha}")
        if not 0 <= self.range_ratio <= 1:
            raise ValueError(f"range_ratio must be in [0, 1], got {self.range_ratio}")
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")


class MistralVocab:
    """The one tokenizer method SGLang's id generator calls, over the Mistral v3 vocabulary."""

    def __init__(self) -> None:
        from jenga_sglang.bench.traces.sharegpt import BundledTokenizer

        self.tokenizer = BundledTokenizer()
        sp = self.tokenizer.sp
        self._vocab = {sp.id_to_piece(i): i for i in range(int(sp.vocab_size()))}

    @property
    def size(self) -> int:
        return len(self._vocab)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)


@contextlib.contextmanager
def _seeded_globals(seed: int) -> Any:
    """Seed `random` and `numpy.random` as bench_serving does; put the old states back after."""
    py_state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def sglang_rows(p: GSPParams, vocab: MistralVocab) -> list[tuple[int, list[int], int]]:
    """(group, prompt ids, output length) per request, in SGLang's (shuffled) order."""
    from sglang.benchmark.datasets.generated_shared_prefix import (
        sample_generated_shared_prefix_requests,
    )

    with _seeded_globals(p.seed), contextlib.redirect_stdout(sys.stderr):
        rows = sample_generated_shared_prefix_requests(
            num_groups=p.groups,
            prompts_per_group=p.prompts_per_group,
            system_prompt_len=p.system_prompt_len,
            question_len=p.question_len,
            output_len=p.output_len,
            range_ratio=p.range_ratio,
            tokenizer=vocab,  # get_vocab() is all it uses
            seed=p.seed,
            send_routing_key=True,
            group_distribution=p.popularity,
            zipf_alpha=p.zipf_alpha if p.popularity == "zipf" else None,
            input_ids=True,
        )
    out: list[tuple[int, list[int], int]] = []
    for row in rows:
        group = int(str(row.routing_key).rsplit("_", 1)[1])
        out.append((group, [int(t) for t in row.prompt], int(row.output_len)))
    return out


def gsp_trace(p: GSPParams) -> tuple[list[Request], dict[str, Any]]:
    """The requests (arrival order) and what the metadata should add about them."""
    vocab = MistralVocab()
    rows = sglang_rows(p, vocab)
    rng = make_rng(p.seed, 17)
    times = poisson_times(rng, len(rows), p.rate)
    reqs: list[Request] = []
    sizes = [0] * p.groups
    for i, ((group, prompt, out_len), ts) in enumerate(zip(rows, times, strict=True)):
        reply = random_tokens(rng, out_len, vocab.size) if out_len else []
        reqs.append(Request(i, 0, ts, prompt, reply))
        sizes[group] += 1
    extra = {
        "generator": "sglang.benchmark.datasets.generated_shared_prefix."
        "sample_generated_shared_prefix_requests",
        "tokenizer": vocab.tokenizer.describe(),
        "requests_per_group": sizes,
    }
    return sort_requests(reqs), extra
