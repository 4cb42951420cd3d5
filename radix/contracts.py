"""The contracts the tree is built on: what it asks of the policies that drive it.

* `EvictionPolicy`: which cached entry goes next (the tree keeps it informed and asks it for
  victims);
* `NodeCost`: what a node is worth to a FLOP-aware policy (radix/cost.py: the model spec's);
* `AdmissionPolicy`: which SSM states, and how much of a sequence, enter the cache, as a
  `CheckpointPlan` made from the `Branch` where the sequence leaves the tree;
* `TierPolicy`: with a host-memory tier (radix/host.py), what device eviction moves to host,
  what a hit loads back, and (its `host` ranking) what host memory drops.

They live below the tree so that the layering runs one way: radix/ defines them and calls them,
policies/ implements them, and nothing here imports policies/. The implementations are
framework-free, so one of each serves both drivers of the cache: the simulator and SGLang.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from mypy_extensions import mypyc_attr

from jenga_sglang.radix.node import Node

if TYPE_CHECKING:
    from jenga_sglang.radix.match import Walk
    from jenga_sglang.radix.tokens import TokenSeq


@mypyc_attr(allow_interpreted_subclasses=True)
class EvictionPolicy(ABC):
    """Chooses which cached entry goes next.

    The tree keeps the policy informed and asks it for victims:
    * `update(node)` after the node was created or anything the policy may read changed
      (children, lock_ref, state, key, last_access);
    * `remove(node)` when the node leaves the tree;
    * `refresh(path, now)` on a cache hit: the policy decides which nodes' last_access moves;
    * `victim()` returns an evictable node (lock_ref == 0, not the root) or None.

    A victim is either a leaf (the tree frees everything it holds) or an inner node that holds an
    SSM checkpoint (the tree drops the checkpoint; a node with one child then merges into it,
    which absorbs its KV). A policy must only return nodes of those two shapes.
    """

    #: Weight of FLOP efficiency against recency; 0 means recency only.
    alpha: float = 0.0

    #: Whether the tree may keep a chain of checkpointed nodes inserted together as one node, a
    #: run (radix/node.py), and evict it from the bottom one segment at a time. Only for a policy
    #: whose victims are leaves ranked by what every segment of the chain shares (recency, locks):
    #: the tree does not call `update` when a segment goes.
    evicts_runs: bool = False

    @abstractmethod
    def update(self, node: Node) -> None: ...

    @abstractmethod
    def remove(self, node: Node) -> None: ...

    @abstractmethod
    def refresh(self, path: Sequence[Node], now: int) -> None: ...

    def warm(self, path: Sequence[Node], now: int) -> None:
        """A hit looked up for a request the driver leaves waiting (a server matches its
        waiting requests every round): it keeps its recency, as SGLang keeps a waiting
        request's prefix, but no hit is counted: `refresh` counts it once, when the request is
        taken. By default `refresh`, for a policy whose refresh is recency alone."""
        self.refresh(path, now)

    @abstractmethod
    def victim(self) -> Node | None: ...

    def bind_cost(self, node_flops: NodeCost) -> None:  # noqa: B027 - optional hook
        """Give the policy the cost model it needs (FLOP-aware policies override this)."""

    def observe(self, walk: Walk) -> None:  # noqa: B027 - optional hook
        """A request's raw walk (where it leaves the tree), before anything is inserted."""

    def passing(self, walk: Walk, now: int) -> None:  # noqa: B027 - optional hook
        """The walk of the whole sequence (input + output) the request's insert will take at
        time `now`, told after `refresh` when the driver knows it (sequential serving).
        Marconi's reference simulator refreshes what that walk reaches too; by default a hit
        refreshes alone."""

    def expend(self, nodes: Sequence[Node]) -> None:  # noqa: B027 - optional hook
        """The admission expects no later request to reuse `nodes` (a just-cached chain down
        to a leaf): a policy may evict them before anything else. A later hit through one of
        them proves it wrong; the default keeps them in the ordinary order."""

    def reuse_odds(self, node: Node) -> float:
        """The chance, in [0, 1], that the victim `node` just named is hit again (a host tier
        weighs a demotion by it: policies/host.py). 1 by default; a policy that evicts first
        what it expects dead says 0 for those, or the rate at which it measured them revived."""
        return 1.0


@mypyc_attr(allow_interpreted_subclasses=True)
class TierPolicy(ABC):
    """What crosses between the device and a host tier (radix/host.py, docs/host-tier.md).

    `host` ranks the host entries: host leaves (a host node without host children: its KV and
    checkpoint) and host checkpoints of other nodes; it is told of them with `update` and
    `remove` as for device nodes, and names host victims with `victim`."""

    host: EvictionPolicy

    @abstractmethod
    def bind_cost(self, node_flops: NodeCost) -> None:
        """The cost model the decisions weigh (the cache's, as its eviction policy's)."""

    @abstractmethod
    def demotes(self, node: Node, state_only: bool) -> bool:
        """Whether the device victim `node` (with `state_only`: its checkpoint alone) moves to
        host memory rather than being dropped."""

    @abstractmethod
    def loads(self, load_bytes: int, flops_after: float, flops_without: float) -> bool:
        """Whether a hit whose host part weighs `load_bytes` is loaded back, leaving
        `flops_after` prefill FLOPs to compute, rather than recomputing `flops_without` from
        the device hit."""


@mypyc_attr(allow_interpreted_subclasses=True)
class NodeCost(ABC):
    """FLOPs saved by a node's own tokens and the bytes it holds (from the model spec)."""

    @abstractmethod
    def flops_saved(self, node: Node) -> float: ...

    @abstractmethod
    def bytes_held(self, node: Node) -> int: ...


@dataclass(frozen=True)
class CheckpointPlan:
    """Where a request's SSM states are captured, as exact token positions.

        0 ........ hit ........ prefill_at[i] ........ len(input) ........ finish_at
        |-- cached --|---------- prefilled -------------|---- decoded ------|

    `prefill_at` are captured during prefill (positions in (hit, len(input)]); `finish_at` after
    the last decoded token. `cache_len` is how many tokens of input + output the tree keeps.
    The tree keeps [expendable_from, cache_len) too, but the admission expects no later
    request to reuse it, so the eviction policy may drop it before anything else:

        0 ...... branch = expendable_from ........................ cache_len
        |-- reused by the next request --|-- expendable (evicted first) --|
    """

    prefill_at: tuple[int, ...] = ()
    finish_at: tuple[int, ...] = ()
    cache_len: int = 0
    expendable_from: int | None = None
    notes: dict[str, int] = field(default_factory=dict, compare=False)

    @property
    def positions(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.prefill_at) | set(self.finish_at)))

    def on_pages(self, page: int, hit: int) -> CheckpointPlan:
        """The plan a tree of `page`-token pages can keep: a checkpoint or a cached length only
        on a page boundary, so each position is floored to one (dropped when that is no
        further than the hit), as is `cache_len`; the expendable part starts at the page
        holding `expendable_from`, so nothing before it is marked."""

        def floored(ps: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(sorted({p - p % page for p in ps if p - p % page > hit}))

        expendable = self.expendable_from
        if expendable is not None:
            expendable += -expendable % page
        return CheckpointPlan(
            floored(self.prefill_at),
            floored(self.finish_at),
            self.cache_len - self.cache_len % page,
            expendable,
            self.notes,
        )


@mypyc_attr(allow_interpreted_subclasses=True)
class AdmissionPolicy(ABC):
    """Decides which SSM states (and how much of a sequence) enter the cache.

    `plans_on_sequence`: the branch a plan gets is where the whole sequence (input + output)
    leaves the tree, as in Marconi's reference simulator, which inserts it in one piece; the
    branch point may then lie in the output. Only a driver that knows the output at admission
    (sequential serving) can plan so; `PrefixCache.plan` refuses it otherwise. False (every
    policy a server runs): where the input leaves the tree, which is all prefill can checkpoint.
    """

    plans_on_sequence: bool = False

    @abstractmethod
    def plan(self, branch: Branch, input_len: int, total_len: int, hit_len: int) -> CheckpointPlan:
        """Plan for a request whose input has `input_len` tokens and whose input + output has
        `total_len`. `branch` says where the input (with `plans_on_sequence`, input + output)
        leaves the tree (speculative insertion), or what `recall` made of that."""

    def recall(self, tokens: TokenSeq, branch: Branch, namespace: str | None = None) -> Branch:
        """The branch to plan `tokens` with, given where they leave the tree (in the request's
        `namespace`, radix/spaces.py). A policy that remembers sequences the tree has evicted
        may return a deeper one, found among the sequences of that namespace only; by default
        the tree's."""
        return branch

    def finished(  # noqa: B027 - optional hook
        self, tokens: TokenSeq, namespace: str | None = None
    ) -> None:
        """A request of `namespace` is done: `tokens` is its input + output (cached or not)."""


class Branch(NamedTuple):
    """Result of a speculative insertion: where a sequence would leave the tree.

    A named tuple (built in C: one per request) rather than a frozen dataclass.

    `length` is the number of leading tokens already in the tree. `at_node_end` is True when that
    point is the end of an existing node (inserting would create no new intermediate node),
    `checkpointed` whether that node holds an SSM state, and `fanout` how many continuations the
    tree already holds there (the node's children at a node end; 1 in the middle of an edge).
    `tail` is, for a branch in the middle of an edge, how many tokens of the cached sequence
    continue past the branch point (down to the leaf of that edge's only-child chain): how far
    from that sequence's end the new input diverged. 0 at a node end.
    """

    length: int
    at_node_end: bool
    checkpointed: bool
    fanout: int = 1
    tail: int = 0
