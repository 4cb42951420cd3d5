"""Admission that learns where the next request will leave a freshly computed sequence.

Speculative insertion checkpoints the point where a request leaves the tree. That serves the
requests that come back to exactly that point (a chat's next turn continues at the previous
sequence's end). Agent scaffolds that rewrite their history (SWE-agent elides the observation
from 5 turns back) send a next request that shares the previous sequence only up to a point
some way *before its end*: that point has no checkpoint, so the next request resumes from the
last one that exists. When the previous request found most of its prefix in the tree, that
is its own branch point, one turn earlier: a small loss. When it found nothing (its session
was evicted), the only checkpoints are its end and the shared system prompt, and the next
request misses almost everything too: one eviction costs two requests.

`BranchLearningAdmission` measures, for every request that leaves a cached sequence in the
middle of an edge, how far before that sequence's end it left it (`Branch.tail`). Once such
divergences are the common case (at least `min_rate` of the recent requests that extended a
cached sequence, against those that continued exactly at its end) it checkpoints a
request whose prefill is longer than what divergences usually skip at the positions
`total_len - q` for a few quantiles q of the learned tail lengths: the next request then
resumes from the nearest one below its branch point. Chat workloads, whose requests continue
at the end of the previous sequence, never reach `min_rate` and get plain speculative
admission. Nothing here knows about agents or sessions: only branch positions are observed.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence

from jenga_sglang.policies.admission import SpeculativeAdmission
from jenga_sglang.policies.base import Branch, CheckpointPlan


class BranchLearningAdmission(SpeculativeAdmission):
    """Speculative admission plus checkpoints where the next request is likely to branch.

    * `window`: recent requests that extended a cached sequence, the statistics' sample.
    * `min_rate`: share of those that must have left it mid-edge rather than at its end.
    * `min_samples`: tail lengths needed before any prediction.
    * `quantiles`: tail quantiles that become checkpoints (at most one state each).
    * `gate`: only a request whose prefilled span exceeds this quantile of the tails gets
      them; a request that resumed near its own branch point already has the checkpoint the
      next one needs (its speculative branch checkpoint).
    * `min_gap`: tokens between two checkpoints (and above the deepest existing one); the
      bundle passes a state's KV-equivalent tokens: closer, a state saves less than it weighs.
    * `prompt_end`: as `SpeculativeAdmission`'s (the server's default).
    """

    def __init__(
        self,
        min_branch_tokens: int = 0,
        min_gap: int = 1,
        window: int = 256,
        min_rate: float = 0.5,
        min_samples: int = 32,
        quantiles: Sequence[float] = (0.25, 0.5, 0.75, 0.9),
        gate: float = 0.75,
        prompt_end: bool = False,
    ) -> None:
        super().__init__(
            max_states=2,
            min_branch_tokens=min_branch_tokens,
            short_branch_fanout=2,
            prompt_end=prompt_end,
        )
        if window < 1 or min_samples < 1 or min_gap < 1 or not 0 <= min_rate <= 1:
            raise ValueError(
                f"need window, min_samples, min_gap >= 1 and 0 <= min_rate <= 1, got {window}, "
                f"{min_samples}, {min_gap}, {min_rate}"
            )
        if not all(0 <= q <= 1 for q in (*quantiles, gate)):
            raise ValueError(f"quantiles and gate must lie in [0, 1], got {quantiles}, {gate}")
        self.min_gap = min_gap
        self.min_rate = min_rate
        self.min_samples = min_samples
        self.quantiles = tuple(sorted(quantiles))
        self.gate = gate
        # one entry per recent request that extended a cached sequence: its tail (0: at the end)
        self._recent: deque[int] = deque(maxlen=window)
        self._tails: list[int] = []  # the positive entries of _recent, sorted (kept as it moves)

    def observe(self, branch: Branch) -> None:
        """Record a request that found a cached sequence it extends: it either continues at
        that sequence's end (a leaf end, fanout 0: tail 0) or leaves it mid-edge (tail > 0).
        Other requests (left the tree at a shared junction: their own history was not cached)
        say nothing about where requests branch and are not counted, nor are divergences
        after fewer than `min_branch_tokens` shared tokens: a new conversation leaving another
        one after the chat template's opening tokens is not a rewrite of its own history."""
        if branch.tail > 0:
            if branch.length >= self.min_branch_tokens:
                self._record(branch.tail)
        elif branch.at_node_end and branch.fanout == 0 and branch.length > 0:
            self._record(0)

    def _record(self, tail: int) -> None:
        recent = self._recent
        if len(recent) == recent.maxlen and recent[0] > 0:  # about to drop out of the window
            del self._tails[bisect_left(self._tails, recent[0])]
        recent.append(tail)
        if tail > 0:
            insort(self._tails, tail)

    def predicted_tails(self) -> list[int] | None:
        """Learned tail lengths (sorted), or None while mid-edge divergences are not common."""
        tails = self._tails
        if len(tails) < self.min_samples or len(tails) < self.min_rate * len(self._recent):
            return None
        return list(tails)

    def plan(self, branch: Branch, input_len: int, total_len: int, hit_len: int) -> CheckpointPlan:
        self.observe(branch)
        plan = super().plan(branch, input_len, total_len, hit_len)
        tails = self.predicted_tails()
        if tails is None or branch.tail > 0:
            # A request that left a cached sequence mid-edge has its branch checkpoint, and a
            # rewriting workload branches next just past it (it rewrites the following piece
            # of the same history): states further down would be skipped.
            return plan
        # The prompt-end state (if planned) ends the prefill; predictions go above the deepest
        # state below it and keep `min_gap` from every planned state.
        below_end = [p for p in plan.prefill_at if p < input_len]
        base = max((hit_len, *below_end))
        if input_len - base <= _quantile(tails, self.gate):
            return plan
        extra: list[int] = []
        for q in reversed(self.quantiles):  # shallowest position first
            at = total_len - _quantile(tails, q)
            spaced = all(abs(at - e) >= self.min_gap for e in (*extra, *plan.prefill_at))
            if base + self.min_gap <= at <= input_len and spaced:
                extra.append(at)
        if not extra:
            return plan
        prefill = tuple(sorted({*plan.prefill_at, *extra}))
        return CheckpointPlan(prefill, plan.finish_at, plan.cache_len, {"predicted": len(extra)})


def _quantile(sorted_values: Sequence[int], q: float) -> int:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
