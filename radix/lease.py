"""A request's hold on the cache, from `PrefixCache.admit` to `PrefixCache.release`.

The driver keeps it and hands it back; only the cache reads what it holds. It is the one place
a request's cache-side state lives between the calls of its lifecycle:

    lookup ─> admit ─> extend* ─> commit? ─> release
              touch,   pages for   insert,    free what is left, unlock,
              plan,    tokens it   with the   hand the finished sequence
              lock     computes    held walk  to the policies

A plain class with slots (one per admitted request; compiled, a native class).
"""

from __future__ import annotations

from jenga_sglang.radix.contracts import CheckpointPlan
from jenga_sglang.radix.match import MatchResult, Walk
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import Pages
from jenga_sglang.radix.tokens import TokenSeq


class Lease:
    """What one admitted request holds: its match, plan, lock and the pages it computed.

    Public for the driver: `hit` (tokens reused), `plan` (what the admission decided) and
    `holds_state` (whether its running SSM state is allocated). The rest is the cache's.
    """

    __slots__ = (
        "_ahead",
        "_anchor",
        "_kv",
        "_locked",
        "_now",
        "_owner",
        "_start",
        "_states",
        "cached",
        "found",
        "namespace",
        "plan",
        "tokens",
    )

    def __init__(
        self,
        tokens: TokenSeq,
        found: MatchResult,
        plan: CheckpointPlan,
        owner: int,
        now: int,
        ahead: Walk | None,
        namespace: str | None = None,
    ) -> None:
        self.tokens = tokens
        self.namespace = namespace  # where its sequence is looked up and stored (spaces.py)
        self.found = found
        self.plan = plan
        self.cached = False  # set by a commit that stored the sequence
        self._owner = owner
        self._now = now
        # The walk of the sequence to be stored, when the driver walked it at admission
        # (sequential serving: nothing changes the tree before its commit).
        self._ahead = ahead
        self._locked = False  # admitted with a lock (on `_anchor`; None: nothing to lock)
        self._anchor: Node | None = None  # the locked node
        self._start: Node | None = None  # the deepest locked node the key holds whole
        # Per attention group, runs of pages allocated step by step for tokens [hit, ...):
        # joined once at commit (joining at every decode step would copy the run each time).
        self._kv: list[list[Pages]] = []
        self._states: list[Pages] = []

    @property
    def hit(self) -> int:
        return self.found.length

    @property
    def holds_state(self) -> bool:
        return bool(self._states)

    def __repr__(self) -> str:
        return f"Lease(hit={self.hit}, plan={self.plan}, anchor={self._anchor!r})"


def join(chunks: list[Pages]) -> Pages:
    """One run of pages from many, joining pairwise (O(n log k) copies, not O(n k))."""
    while len(chunks) > 1:
        pairs = zip(chunks[::2], chunks[1::2], strict=False)
        joined = [a.concat(b) for a, b in pairs]
        chunks = joined + ([chunks[-1]] if len(chunks) % 2 else [])
    return chunks[0]
