"""Synthetic agent traces that follow SWE-agent's trajectory structure.

Real SWE-bench trajectories are not reachable here, so this generator reproduces their *structure*
with seeded random token ids (no tokenizer):

* Every session starts with one system prompt shared by all sessions (SWE-agent's fixed system
  prompt and instructions), then its own task description (the issue text).
* Each turn the model emits a thought + action (the request's output), then the environment
  answers with an observation. Both are appended to the history, and the next request's input is
  the whole history.
* SWE-agent keeps only the last ``keep_observations`` (5) observations in full: older ones are
  replaced by a short "output omitted" marker. So when turn k's observation arrives, the one from
  5 turns back is elided, which changes tokens in the middle of the history: the next request
  shares with the previous one only the prefix up to that observation (a branch point strictly
  inside the previous input).
* Observation lengths are log-normal with a heavy tail (file views and test logs), thought+action
  lengths log-normal with a lighter tail, so inputs grow from hundreds to tens of thousands of
  tokens. A session has between ``min_turns`` and ``max_turns`` turns, and ends early once an input
  would exceed ``max_input``.
* Sessions arrive as a Poisson process of ``rate`` sessions/s; gaps between a session's requests
  are exponential with mean ``turn_gap`` seconds (model time + environment time).

Session i is drawn from its own generator seeded by (seed, i), so it does not depend on how many
sessions are built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jenga_sglang.bench.traces.synthetic import Rng, make_rng, poisson_times, random_tokens
from jenga_sglang.bench.traces.trace import Request, sort_requests


@dataclass(frozen=True, slots=True)
class AgentParams:
    """Generator parameters (lengths in tokens, times in seconds)."""

    sessions: int = 100
    rate: float = 0.5
    seed: int = 0
    min_turns: int = 10
    max_turns: int = 60
    keep_observations: int = 5
    system_len: int = 400
    task_median: int = 300
    action_median: int = 120
    action_sigma: float = 0.7
    obs_median: int = 250
    obs_sigma: float = 1.4
    obs_max: int = 16_000
    marker_len: int = 8
    turn_gap: float = 5.0
    max_input: int = 64_000
    vocab: int = 32768

    def __post_init__(self) -> None:
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError(
                f"need 1 <= min_turns <= max_turns, got {self.min_turns}, {self.max_turns}"
            )
        if self.keep_observations < 1:
            raise ValueError(f"keep_observations must be >= 1, got {self.keep_observations}")
        if self.sessions < 0:
            raise ValueError(f"sessions must be >= 0, got {self.sessions}")
        if not self.turn_gap > 0:
            raise ValueError(f"turn_gap must be > 0 s, got {self.turn_gap}")


def _lognormal_len(rng: Rng, median: int, sigma: float, cap: int) -> int:
    return max(1, min(cap, round(median * math.exp(sigma * rng.standard_normal()))))


class _History:
    """The growing context of one session: (segment, is_observation) parts, elided in place."""

    def __init__(self, head: list[int]) -> None:
        self.parts: list[list[int]] = [head]
        self.obs_index: list[int] = []

    def append(self, tokens: list[int], observation: bool) -> None:
        if observation:
            self.obs_index.append(len(self.parts))
        self.parts.append(tokens)

    def elide(self, keep: int, marker: list[int]) -> None:
        """Replace the observation ``keep`` back from the newest by the marker."""
        if len(self.obs_index) > keep:
            self.parts[self.obs_index[-keep - 1]] = marker

    def tokens(self) -> list[int]:
        return [t for part in self.parts for t in part]


def agent_trace(p: AgentParams) -> list[Request]:
    """Build the trace, sorted by ts."""
    shared = make_rng(p.seed, 0)
    system = random_tokens(shared, p.system_len, p.vocab)
    marker = random_tokens(shared, p.marker_len, p.vocab)
    starts = poisson_times(make_rng(p.seed, 1), p.sessions, p.rate) if p.sessions else []
    out: list[Request] = []
    for sid, start in enumerate(starts):
        out.extend(_session(p, sid, start, system, marker))
    return sort_requests(out)


def _session(
    p: AgentParams, sid: int, start: float, system: list[int], marker: list[int]
) -> list[Request]:
    rng = make_rng(p.seed, 2, sid)
    task = random_tokens(rng, _lognormal_len(rng, p.task_median, 0.6, 4000), p.vocab)
    hist = _History(system + task)
    turns = int(rng.integers(p.min_turns, p.max_turns + 1))
    ts = start
    out: list[Request] = []
    for turn in range(turns):
        prompt = hist.tokens()
        if len(prompt) > p.max_input:
            break
        action_len = _lognormal_len(rng, p.action_median, p.action_sigma, 4000)
        action = random_tokens(rng, action_len, p.vocab)
        out.append(Request(sid, turn, ts, prompt, action))
        obs_len = _lognormal_len(rng, p.obs_median, p.obs_sigma, p.obs_max)
        hist.append(action, observation=False)
        hist.append(random_tokens(rng, obs_len, p.vocab), observation=True)
        hist.elide(p.keep_observations, marker)
        ts += float(rng.exponential(p.turn_gap))
    return out
