"""Abandoned tails: what a request left behind when it diverged inside a cached sequence.

When a request leaves a cached sequence in the middle of an edge, the rest of that sequence
(the part of the edge after the branch point and the only-child chain below it) has been
bypassed. Whether it is still worth its bytes depends on the workload:

* a chat session whose first turn was cut at a shared template by another session comes back
  and extends that tail: it is alive;
* an agent that rewrote its history (SWE-agent elides an old observation) never comes back to
  the previous request's tail: thousands of tokens of KV are dead on arrival. LRU keeps them
  as long as any other entry of their age, and the FLOP-aware utility keeps them longer (long
  deep edges are FLOP-efficient).

`BypassLearner` marks these tails and measures which case holds, on a control sample that is
never treated specially (1 in `control_every` bypass events, chosen by node id): a control
tail is *revived* when a later hit runs through it and *dead* when it leaves the tree first.
Only divergences after at least `min_shared` tokens count: a new conversation that leaves another
one after a chat template's opening tokens has not rewritten anything. Once at least
`min_resolved` control tails are resolved and fewer than `max_revival` of them
were revived, the policy trusts the signal and evicts marked tails before anything else. The
control sample keeps measuring, so a change of workload turns the rule off again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from jenga_sglang.radix.match import Walk
from jenga_sglang.radix.node import Node


class BypassLearner:
    def __init__(
        self,
        control_every: int = 8,
        min_resolved: int = 16,
        max_revival: float = 0.1,
        min_shared: int = 0,
    ) -> None:
        if control_every < 2 or min_resolved < 1 or not 0 <= max_revival <= 1:
            raise ValueError(
                f"need control_every >= 2, min_resolved >= 1, 0 <= max_revival <= 1, got "
                f"{control_every}, {min_resolved}, {max_revival}"
            )
        self.control_every = control_every
        self.min_resolved = min_resolved
        self.max_revival = max_revival
        self.min_shared = min_shared
        self._marked: dict[int, Node] = {}  # bypassed tails still in the tree, control included
        self._control: set[int] = set()
        self.revived = 0
        self.dead = 0

    # ------------------------------------------------------------------ events

    def observe(self, walk: Walk) -> list[Node]:
        """A request's walk; returns the nodes it newly marks as a bypassed tail."""
        if not walk.path or walk.path[-1].end == walk.length or walk.length < self.min_shared:
            return []
        chain = list(_only_child_chain(walk.path[-1]))
        if chain[-1].children:
            return []  # the path forks below: not one abandoned sequence
        control = walk.path[-1].id % self.control_every == 0
        fresh = [n for n in chain if n.id not in self._marked]
        for node in fresh:
            self._marked[node.id] = node
            if control:
                self._control.add(node.id)
        return fresh

    def hit(self, path: Iterable[Node]) -> list[Node]:
        """A hit ran through `path`: its marked nodes are alive after all; returns them."""
        revived = [n for n in path if n.id in self._marked]
        for node in revived:
            del self._marked[node.id]
            if node.id in self._control:
                self._control.discard(node.id)
                self.revived += 1
        return revived

    def removed(self, node: Node) -> None:
        if self._marked.pop(node.id, None) is not None and node.id in self._control:
            self._control.discard(node.id)
            self.dead += 1

    # ------------------------------------------------------------------ decisions

    @property
    def trusted(self) -> bool:
        resolved = self.revived + self.dead
        return resolved >= self.min_resolved and self.revived < self.max_revival * resolved

    def goes_first(self, node: Node) -> bool:
        """Evict before everything else: a marked, non-control tail while the signal holds."""
        return node.id in self._marked and node.id not in self._control and self.trusted

    def marked(self) -> list[Node]:
        return list(self._marked.values())


def _only_child_chain(node: Node) -> Iterator[Node]:
    yield node
    while len(node.children) == 1:
        (node,) = node.children.values()
        yield node
