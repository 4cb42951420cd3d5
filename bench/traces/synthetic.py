"""Seeded synthetic traces with known prefix-sharing structure.

Token ids are drawn uniformly from ``[FIRST_ID, vocab)`` by a seeded numpy generator, so two
independently drawn segments practically never share a token prefix: all sharing in these traces
is the sharing the generator builds on purpose.

* :func:`doc_qa` (Jenga §7.3): ``articles`` long documents, ``questions`` questions asked at the end
  of each; input = article + question, short outputs. Session = article, turn = question in
  arrival order. Questions arrive as a Poisson process in random order over all articles.
* :func:`system_chat`: single-turn requests = one of ``prompts`` shared system prompts + a fresh
  user message. Session = request.
* :func:`fork`: SGLang frontend programs ``few-shot prefix + question, then fork(n)``: every program
  shares one few-shot prefix, adds its own question, then ``branches`` requests arrive together,
  each appending its own branch instruction. Session = program, turn = branch.
* :func:`tree_of_thought`: SGLang tree-of-thought: each node forks ``branching`` children; the
  request for a child is its parent's path + a branch instruction, its output is the child's
  thought, and the child's path = that input + output. Siblings branch at the end of the parent's
  path, which lies in the middle of every deeper request. Level d arrives at tree start +
  d * ``level_gap``. Session = tree, turn = node in breadth-first order.

Sessions / programs / trees / questions arrive as Poisson processes at ``rate`` per second.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jenga_sglang.bench.traces.trace import Request, sort_requests

FIRST_ID = 100  # keep clear of special / control ids
Rng = np.random.Generator


def make_rng(seed: int, *stream: int) -> Rng:
    """An independent generator per (seed, stream...) so parts do not shift each other."""
    return np.random.default_rng([seed, *stream])


def random_tokens(rng: Rng, n: int, vocab: int) -> list[int]:
    if vocab <= FIRST_ID:
        raise ValueError(f"vocab must be > {FIRST_ID}, got {vocab}")
    ids: list[int] = rng.integers(FIRST_ID, vocab, size=n).tolist()
    return ids


def uniform_len(rng: Rng, lo: int, hi: int) -> int:
    if not 0 < lo <= hi:
        raise ValueError(f"length range must satisfy 0 < lo <= hi, got [{lo}, {hi}]")
    return int(rng.integers(lo, hi + 1))


def poisson_times(rng: Rng, n: int, rate: float) -> list[float]:
    """Arrival times of ``n`` events of a Poisson process of ``rate``/s starting at 0."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0 per second, got {rate}")
    gaps = rng.exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    times: list[float] = np.cumsum(gaps).tolist()
    return times


@dataclass(frozen=True, slots=True)
class DocQAParams:
    articles: int = 8
    questions: int = 4
    article_len: tuple[int, int] = (20_000, 40_000)
    question_len: tuple[int, int] = (20, 60)
    output_len: tuple[int, int] = (50, 100)
    rate: float = 1.0
    vocab: int = 32768
    seed: int = 0


def doc_qa(p: DocQAParams) -> list[Request]:
    rng = make_rng(p.seed, 0)
    docs = [
        random_tokens(rng, uniform_len(rng, *p.article_len), p.vocab) for _ in range(p.articles)
    ]
    order = [a for a in range(p.articles) for _ in range(p.questions)]
    rng.shuffle(order)
    times = poisson_times(rng, len(order), p.rate)
    asked = [0] * p.articles
    out: list[Request] = []
    for art, ts in zip(order, times, strict=True):
        q = random_tokens(rng, uniform_len(rng, *p.question_len), p.vocab)
        ans = random_tokens(rng, uniform_len(rng, *p.output_len), p.vocab)
        out.append(Request(art, asked[art], ts, docs[art] + q, ans))
        asked[art] += 1
    return sort_requests(out)


@dataclass(frozen=True, slots=True)
class SystemChatParams:
    requests: int = 200
    prompts: int = 1
    system_len: tuple[int, int] = (1000, 2000)
    user_len: tuple[int, int] = (20, 400)
    output_len: tuple[int, int] = (20, 300)
    rate: float = 2.0
    vocab: int = 32768
    seed: int = 0


def system_chat(p: SystemChatParams) -> list[Request]:
    rng = make_rng(p.seed, 1)
    systems = [
        random_tokens(rng, uniform_len(rng, *p.system_len), p.vocab) for _ in range(p.prompts)
    ]
    times = poisson_times(rng, p.requests, p.rate)
    out: list[Request] = []
    for i, ts in enumerate(times):
        system = systems[int(rng.integers(0, p.prompts))]
        user = random_tokens(rng, uniform_len(rng, *p.user_len), p.vocab)
        reply = random_tokens(rng, uniform_len(rng, *p.output_len), p.vocab)
        out.append(Request(i, 0, ts, system + user, reply))
    return sort_requests(out)


@dataclass(frozen=True, slots=True)
class ForkParams:
    programs: int = 50
    branches: int = 4
    few_shot_len: tuple[int, int] = (1500, 1500)
    question_len: tuple[int, int] = (50, 200)
    branch_len: tuple[int, int] = (5, 20)
    output_len: tuple[int, int] = (50, 200)
    rate: float = 1.0
    vocab: int = 32768
    seed: int = 0


def fork(p: ForkParams) -> list[Request]:
    rng = make_rng(p.seed, 2)
    few_shot = random_tokens(rng, uniform_len(rng, *p.few_shot_len), p.vocab)
    times = poisson_times(rng, p.programs, p.rate)
    out: list[Request] = []
    for prog, ts in enumerate(times):
        prefix = few_shot + random_tokens(rng, uniform_len(rng, *p.question_len), p.vocab)
        for b in range(p.branches):
            suffix = random_tokens(rng, uniform_len(rng, *p.branch_len), p.vocab)
            reply = random_tokens(rng, uniform_len(rng, *p.output_len), p.vocab)
            out.append(Request(prog, b, ts, prefix + suffix, reply))
    return sort_requests(out)


@dataclass(frozen=True, slots=True)
class TreeParams:
    trees: int = 20
    depth: int = 3
    branching: int = 3
    prompt_len: tuple[int, int] = (500, 1500)
    instruction_len: tuple[int, int] = (5, 20)
    thought_len: tuple[int, int] = (50, 200)
    level_gap: float = 2.0
    rate: float = 0.5
    vocab: int = 32768
    seed: int = 0


def tree_of_thought(p: TreeParams) -> list[Request]:
    if p.depth < 1 or p.branching < 1:
        raise ValueError(f"depth and branching must be >= 1, got {p.depth}, {p.branching}")
    rng = make_rng(p.seed, 3)
    times = poisson_times(rng, p.trees, p.rate)
    out: list[Request] = []
    for tree, start in enumerate(times):
        frontier = [random_tokens(rng, uniform_len(rng, *p.prompt_len), p.vocab)]
        turn = 0
        for level in range(p.depth):
            children: list[list[int]] = []
            for path in frontier:
                for _ in range(p.branching):
                    inp = path + random_tokens(rng, uniform_len(rng, *p.instruction_len), p.vocab)
                    thought = random_tokens(rng, uniform_len(rng, *p.thought_len), p.vocab)
                    out.append(Request(tree, turn, start + level * p.level_gap, inp, thought))
                    children.append(inp + thought)
                    turn += 1
            frontier = children
    return sort_requests(out)
