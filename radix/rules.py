"""Per-layer-type cache-hit rules (Jenga §5.2 `get_possible_prefix`, one class per layer type).

Each rule answers one question about the matched path: the longest prefix p <= limit that this
layer group could reuse. The tree combines them in a fixed point (see `longest_common_valid`):

    full attention   every token [0, p) cached (pages are never dropped mid-path: p = limit)
    sliding window   the last w tokens [p - w, p) cached (no tombstone in that window)
    mamba            an SSM checkpoint exactly at p (a node ending at p holds a state), or p = 0;
                     no rule where the states arrive from a peer (`MambaGroup.from_peer`)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from mypy_extensions import mypyc_attr

from jenga_sglang.radix.node import Node


@mypyc_attr(allow_interpreted_subclasses=True)
class GroupRule(ABC):
    """The hit rule of one layer group."""

    @abstractmethod
    def longest_valid(self, path: Sequence[Node], limit: int) -> int:
        """Largest p <= limit valid for this group; `path` covers at least [0, limit)."""


class FullAttentionRule(GroupRule):
    def longest_valid(self, path: Sequence[Node], limit: int) -> int:
        return limit


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class SlidingWindowRule(GroupRule):
    """Valid p: no tombstoned position in [p - window, p).

    Tombstones are per node a leading run [start, start + tombstones[slot]). If the last tombstoned
    position below p lies in a run [a, b), every p' in (a, p] still sees a tombstone at p' - 1 or
    earlier inside its window, so the next candidate is exactly a. Each step moves p below one run:
    the loop ends after at most one step per node.
    """

    def __init__(self, window: int, slot: int) -> None:
        if window <= 0:
            raise ValueError(f"sliding window must be positive, got {window}")
        self.window = window
        self.slot = slot

    def longest_valid(self, path: Sequence[Node], limit: int) -> int:
        runs = [
            (n.start, n.start + n.tombstones[self.slot]) for n in path if n.tombstones[self.slot]
        ]
        p = limit
        for run_start, run_end in reversed(runs):
            if run_start >= p:
                continue
            last_dropped = min(run_end, p) - 1
            if last_dropped < p - self.window:
                return p
            p = run_start
        return p


class MambaRule(GroupRule):
    """Valid p: 0, or the end of a path node holding an SSM checkpoint."""

    def longest_valid(self, path: Sequence[Node], limit: int) -> int:
        for i in range(len(path) - 1, -1, -1):  # deepest first; compiled, reversed() is generic
            node = path[i]
            if node.end <= limit and node.state is not None:
                return node.end
        return 0


def longest_common_valid(rules: Sequence[GroupRule], path: Sequence[Node], limit: int) -> int:
    """The longest prefix valid for every group (Jenga: longest common valid prefix).

    Fixed point: p starts at the matched length and each rule lowers it to its own longest valid
    prefix <= p. p never increases and is bounded below by 0, so the loop terminates; when a full
    pass changes nothing, p is valid for every group, and it is the largest such p because each
    rule only ever lowers p to its *largest* valid value below the current bound.
    """
    p = limit
    while True:
        before = p
        for rule in rules:
            p = rule.longest_valid(path, p)
        if p == before:
            return p
