"""Eviction policies: LRU (SGLang+ style) and FLOP-aware (Marconi).

LRU
    Candidates: unlocked leaves. A hit refreshes every node of the matched path. Victim: the
    least recently used candidate.

FLOP-aware
    Candidates: unlocked leaves, and unlocked nodes with one child that hold an SSM checkpoint
    (evicting those drops the checkpoint; the child absorbs the KV). A hit refreshes only the
    deepest matched node. Victim: the lowest utility

        u(n) = (r_n - r_min) / (r_max - r_min) + alpha * (f_n - f_min) / (f_max - f_min)

    over the candidates, where r is last access and f the node's FLOP efficiency (FLOPs its own
    tokens save relative to its parent, per byte it holds).

    The reference rescans every node per eviction (O(N) each). We keep the candidates in two
    sorted orders, by r and by f, and find the argmin with Fagin's threshold algorithm: walk both
    orders in step; after k steps every unseen node has r >= R[k].r and f >= F[k].f, so its
    utility is at least the threshold u(R[k].r, F[k].f), and we stop once the best seen utility is
    within it. The walk stops at the latest when one order is exhausted (k <= N), and in practice
    after a handful of steps, because low-utility nodes sit near the front of at least one order.
"""

from __future__ import annotations

from collections.abc import Sequence

from jenga_sglang.policies.base import EvictionPolicy, NodeCost
from jenga_sglang.policies.ranking import Ranked
from jenga_sglang.radix.node import Node


class LruEviction(EvictionPolicy):
    """Leaves only; a hit refreshes the whole path."""

    def __init__(self) -> None:
        self._leaves = Ranked()

    def update(self, node: Node) -> None:
        if node.lock_ref == 0 and node.is_leaf and node.parent is not None:
            self._leaves.put(node, node.last_access)
        else:
            self._leaves.discard(node)

    def remove(self, node: Node) -> None:
        self._leaves.discard(node)

    def refresh(self, path: Sequence[Node], now: int) -> None:
        for node in path:
            node.last_access = now
            if node in self._leaves:
                self._leaves.put(node, now)

    def victim(self) -> Node | None:
        return self._leaves.first()


class FlopAwareEviction(EvictionPolicy):
    """Marconi's utility: normalised recency + alpha x normalised FLOP efficiency."""

    def __init__(self, alpha: float = 0.0) -> None:
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        self.alpha = alpha
        self._cost: NodeCost | None = None
        self._by_recency = Ranked()
        self._by_efficiency = Ranked()

    def bind_cost(self, node_flops: NodeCost) -> None:
        self._cost = node_flops

    def efficiency(self, node: Node) -> float:
        if self._cost is None:
            raise RuntimeError("FlopAwareEviction needs bind_cost() before use")
        # A node holding no bytes (all window pages dropped, no state) frees nothing either:
        # count it as one byte so the ratio stays finite and it ranks as very efficient.
        return self._cost.flops_saved(node) / max(1, self._cost.bytes_held(node))

    @staticmethod
    def is_candidate(node: Node) -> bool:
        if node.lock_ref or node.parent is None:
            return False
        return node.is_leaf or (len(node.children) == 1 and node.state is not None)

    def update(self, node: Node) -> None:
        if self.is_candidate(node):
            self._by_recency.put(node, node.last_access)
            self._by_efficiency.put(node, self.efficiency(node))
        else:
            self.remove(node)

    def remove(self, node: Node) -> None:
        self._by_recency.discard(node)
        self._by_efficiency.discard(node)

    def refresh(self, path: Sequence[Node], now: int) -> None:
        deepest = path[-1]
        deepest.last_access = now
        if deepest in self._by_recency:
            self._by_recency.put(deepest, now)

    def utility(self, node: Node) -> float:
        return self._utility(node.last_access, self._by_efficiency.value(node))

    def _utility(self, recency: float, efficiency: float) -> float:
        r_lo, r_hi = self._by_recency.min_value(), self._by_recency.max_value()
        u = (recency - r_lo) / (r_hi - r_lo) if r_hi > r_lo else 0.0
        if self.alpha:
            f_lo, f_hi = self._by_efficiency.min_value(), self._by_efficiency.max_value()
            if f_hi > f_lo:
                u += self.alpha * (efficiency - f_lo) / (f_hi - f_lo)
        return u

    def victim(self) -> Node | None:
        if not self._by_recency:
            return None
        if not self.alpha:
            return self._by_recency.first()
        best: tuple[float, int] | None = None
        best_node: Node | None = None
        by_r = self._by_recency.ascending()
        by_f = self._by_efficiency.ascending()
        for (r, node_r), (f, node_f) in zip(by_r, by_f, strict=True):
            for node in (node_r, node_f):
                key = (self.utility(node), node.id)
                if best is None or key < best:
                    best, best_node = key, node
            assert best is not None
            if best[0] <= self._utility(r, f):
                break
        return best_node


class JengaEviction(FlopAwareEviction):
    """FLOP-aware eviction that first drops superseded checkpoints.

    A one-child node holding a state is, in a multi-turn session, almost always the end of an
    earlier turn: the session has since continued below it and its next turn will hit the
    deeper checkpoint. Such a state only pays off if some request resumes exactly there again,
    which is rare, while it costs as much as hundreds of tokens of KV. So these candidates go
    first (least recently used among them), and Marconi's utility ranks the leaves. Dropping one
    keeps every token's KV (the child absorbs it), so no hit on the continuation is lost.
    """

    def __init__(self, alpha: float = 0.0) -> None:
        super().__init__(alpha)
        self._superseded = Ranked()

    def update(self, node: Node) -> None:
        if self.is_candidate(node) and not node.is_leaf:
            super().remove(node)
            self._superseded.put(node, node.last_access)
        else:
            self._superseded.discard(node)
            super().update(node)

    def remove(self, node: Node) -> None:
        self._superseded.discard(node)
        super().remove(node)

    def refresh(self, path: Sequence[Node], now: int) -> None:
        deepest = path[-1]
        if deepest in self._superseded:
            deepest.last_access = now
            self._superseded.put(deepest, now)
        else:
            super().refresh(path, now)

    def victim(self) -> Node | None:
        first = self._superseded.first()
        return first if first is not None else super().victim()
