"""Admission for workloads that rewrite their own history: ghost branch points, expendable tails.

Speculative insertion checkpoints the point where a request leaves the tree. That serves the
requests that come back to exactly that point: a chat's next turn continues at the end of the
previous sequence. Agent scaffolds that rewrite their history (SWE-agent elides the observation
from 5 turns back) send a next request that leaves the previous sequence in its middle, just
past the point where the previous request itself left *its* predecessor:

    request k:      [shared | history ......... b_k | rewritten part ............ end_k]
    request k + 1:  [shared | history ......... b_k ... b_k+1 | rewritten part ... end_k+1]
                                                 ^ resumes from the state at b_k

Two things follow, and `BranchLearningAdmission` acts on both.

1. **Ghost branch points.** Once request k's pages are evicted the tree no longer holds its
   tokens, so request k + 1 seems to leave the tree at the shared prompt: no state is captured
   at b_k+1 and request k + 2 misses too. A `GhostIndex` (policies/ghost.py) remembers the
   token ids of recently finished sequences; `recall` plans with the ghost's branch point
   when it lies deeper than the tree's, in the middle of a remembered sequence or at a
   junction of several, so the state is captured exactly there.
2. **Expendable tails.** Everything of request k past b_k is what request k + 1 rewrites:
   nobody resumes from it, yet it holds thousands of tokens of KV and a state after the last
   decoded token. A request that left a (real or ghost) sequence mid-edge gets a plan whose
   part past its branch point is expendable (the eviction policy drops it first) and keeps
   no state after its last decoded token. The ghost is what makes that safe: the next
   request finds its own branch point there, not in the evicted tail.

Both apply only once rewrites are the common case.

What is learned: for each request that extends a cached or remembered sequence, whether it
continued at that sequence's end (tail 0: chat) or left it mid-edge (`Branch.tail` > 0).
Rewrites are the common case once at least `min_rate` of the last `window` such requests, and
at least `min_samples`, left mid-edge. Divergences after fewer than `min_branch_tokens` shared
tokens do not count: a new conversation leaving another one after the chat template's opening
tokens has not rewritten anything. Chat workloads never reach `min_rate`, so their plans stay
those of speculative admission. Nothing here knows about agents or sessions: only branch
positions are observed.

Namespaces (LoRA adapters, cache salts; radix/spaces.py): the ghost keeps each namespace's
sequences apart, so a branch point is recalled only from the request's own namespace. What is
learned is shared: whether requests rewrite their history is a trait of the workload, not of
any one tenant's tokens, and it only says how to plan, never what a request may reuse.
"""

from __future__ import annotations

from collections import deque

from jenga_sglang.policies.admission import SpeculativeAdmission
from jenga_sglang.policies.ghost import GhostIndex
from jenga_sglang.radix.contracts import Branch, CheckpointPlan
from jenga_sglang.radix.tokens import TokenSeq

#: Default ghost capacity: 4M token ids, 16 MB of host memory.
GHOST_TOKENS = 1 << 22


class BranchLearningAdmission(SpeculativeAdmission):
    """Speculative admission that remembers evicted sequences' branch points and, for
    rewriting workloads, marks what a rewriting request leaves past its branch point
    expendable.

    * `window`: recent requests that extended a cached or remembered sequence, the sample.
    * `min_rate`: share of those that must have left it mid-edge rather than at its end.
    * `min_samples`: mid-edge divergences needed before plans mark anything expendable.
    * `ghost_tokens`: token ids the ghost index remembers (0: no ghost).
    * `min_branch_tokens`, `prompt_end`: as `SpeculativeAdmission`'s.
    """

    def __init__(
        self,
        min_branch_tokens: int = 0,
        window: int = 256,
        min_rate: float = 0.5,
        min_samples: int = 32,
        ghost_tokens: int = GHOST_TOKENS,
        prompt_end: bool = False,
    ) -> None:
        super().__init__(
            max_states=2,
            min_branch_tokens=min_branch_tokens,
            short_branch_fanout=2,
            prompt_end=prompt_end,
        )
        if window < 1 or min_samples < 1 or not 0 <= min_rate <= 1 or ghost_tokens < 0:
            raise ValueError(
                f"need window, min_samples >= 1, 0 <= min_rate <= 1 and ghost_tokens >= 0, got "
                f"{window}, {min_samples}, {min_rate}, {ghost_tokens}"
            )
        self.min_rate = min_rate
        self.min_samples = min_samples
        self.ghost = GhostIndex(ghost_tokens) if ghost_tokens else None
        # one entry per recent request that extended a sequence: did it leave it mid-edge?
        self._recent: deque[bool] = deque(maxlen=window)
        self._mid_edge = 0  # True entries in _recent
        self.ghost_branches = 0  # plans made with a ghost branch point

    # ------------------------------------------------------------------ learning

    def observe(self, branch: Branch) -> None:
        """Record a request that extends a sequence: it either continues at that sequence's
        end (a leaf end, fanout 0: tail 0) or leaves it mid-edge (tail > 0). Other requests
        (left at a junction of several sequences) say nothing about rewrites and are not
        counted, nor are divergences after fewer than `min_branch_tokens` shared tokens."""
        if branch.tail > 0:
            if branch.length >= self.min_branch_tokens:
                self._record(True)
        elif branch.at_node_end and branch.fanout == 0 and branch.length > 0:
            self._record(False)

    def _record(self, mid_edge: bool) -> None:
        recent = self._recent
        if len(recent) == recent.maxlen and recent[0]:  # about to drop out of the window
            self._mid_edge -= 1
        recent.append(mid_edge)
        self._mid_edge += mid_edge

    @property
    def rewriting(self) -> bool:
        """Whether leaving the extended sequence mid-edge is the common case."""
        mid = self._mid_edge
        return mid >= self.min_samples and mid >= self.min_rate * len(self._recent)

    # ------------------------------------------------------------------ the hooks

    def recall(self, tokens: TokenSeq, branch: Branch, namespace: str | None = None) -> Branch:
        """Once rewrites are the common case, the ghost's branch point where it is deeper than
        the tree's and lies in the middle of a remembered sequence or at a junction of
        several; else the tree's. (In chat workloads ghost branch points are mostly where
        two conversations drift apart, and a state there rarely pays off: on the ShareGPT
        grid, recalling them always cost 0.5% of the mean hit rate.) Only sequences of the
        request's `namespace` are searched: another namespace's history is not its to resume.
        """
        if self.ghost is None or not self.rewriting:
            return branch
        ghost = self.ghost.branch(tokens, namespace)
        if ghost.length <= branch.length or (ghost.at_node_end and ghost.fanout == 0):
            return branch
        self.ghost_branches += 1
        return ghost

    def finished(self, tokens: TokenSeq, namespace: str | None = None) -> None:
        if self.ghost is not None:
            self.ghost.remember(tokens, namespace)

    def plan(self, branch: Branch, input_len: int, total_len: int, hit_len: int) -> CheckpointPlan:
        self.observe(branch)
        plan = super().plan(branch, input_len, total_len, hit_len)
        at = branch.length
        if self.ghost is None or branch.tail == 0 or at < self.min_branch_tokens:
            return plan  # without a ghost, the next request needs this tail to find its branch
        if not self.rewriting:
            return plan
        # The next request resumes from the branch checkpoint and rewrites what follows:
        # no state past it, and the tokens past it go first.
        kept = tuple(p for p in plan.prefill_at if p <= at)
        return CheckpointPlan(kept, (), plan.cache_len, at, {"expendable": plan.cache_len - at})
