"""Marconi's FLOP-aware eviction as the reference simulator computes it (issue #16).

Two terms differ from `FlopAwareEviction` (which `jenga` builds on), both as the reference
(github ruipeterpan/marconi, `radix_cache_hybrid.py`) computes them:

* Recency is the min-max normalisation of 1 / age over the candidates, not of the last access
  itself: the newest nodes spread over the whole [0, 1] range and every node older than a few
  ticks sits near 0, where alpha x FLOP efficiency decides alone.
* FLOP efficiency divides the FLOPs a node's own tokens save (relative to its parent) by the
  bytes of one state plus the KV of the *whole* sequence from the root to the node's end, not by
  the bytes the node holds: deep nodes rank as less efficient than their own bytes would make
  them.

Recency runs on the reference's clock, kept here (`stamp`), since min-max of 1 / age is not
invariant to the clock's offsets: the reference ticks once for the lookup, once for the insert,
once for the insert's own walk of the sequence and, when the insert must evict, once for the
eviction call. A hit stamps the deepest matched node at the walk's tick (the third; the lookup's
tick when the output's walk matches a deeper node whole, which then takes the third), a new node
takes the tick current when it is created (the third, or the fourth after an eviction), and the
eviction measures ages from its own tick. A one-child node that is evicted hands its stamp to
the child that absorbs it when that is newer (the reference keeps the later of the two).
`node.last_access` still carries our one-tick-per-request clock for everything else.
"""

from __future__ import annotations

from collections.abc import Sequence

from jenga_sglang.policies.eviction import FlopAwareEviction
from jenga_sglang.radix.contracts import NodeCost
from jenga_sglang.radix.cost import SpecNodeCost
from jenga_sglang.radix.match import Walk, deepest_whole
from jenga_sglang.radix.node import Node


class MarconiEviction(FlopAwareEviction):
    """u(n) = norm(1 / (now - r_n)) + alpha * norm(f_n): r_n the node's stamp and now the
    eviction call's tick on the reference's clock (`stamp`, `now`), f_n = FLOPs saved by the
    node's tokens / (one state + KV of tokens [0, end))."""

    def __init__(self, alpha: float = 0.0) -> None:
        super().__init__(alpha)
        self._state_bytes = 0
        self._kv_bytes_per_token = 0
        self._stamps: dict[int, int] = {}  # node id -> the reference clock at its last access
        self._base = -3  # the reference clock when the current request started
        self._evicting = False  # the current request has evicted
        self._merging: tuple[int, Node] | None = None  # (one-child victim id, its child)
        self._looked: Node | None = None  # the node the current request's lookup refreshed

    def now(self) -> int:
        """The reference's clock: the insert's walk (third tick of the request), or the
        eviction call's tick once the request evicts."""
        return self._base + 3 + self._evicting

    def stamp(self, node: Node) -> int:
        """The node's last access on the reference's clock (now, for a node not seen before)."""
        return self._stamps.setdefault(node.id, self.now())

    def observe(self, walk: Walk) -> None:
        # every request starts with one lookup: close the previous request's ticks
        self._base += 3 + self._evicting
        self._evicting = False
        self._looked = None

    def update(self, node: Node) -> None:
        self.stamp(node)  # stamp every node when it appears, candidate or not
        super().update(node)

    def _rank(self, node: Node) -> None:
        f = self.efficiency(node)
        r = self.stamp(node)
        self._by_recency.put(node, r)
        self._by_efficiency.put(node, f)
        self._by_blend.put(node, r + self._beta0 * f)

    def refresh(self, path: Sequence[Node], now: int) -> None:
        deepest = path[-1]
        deepest.last_access = now
        self._looked = deepest
        self._restamp(deepest, self.now())

    def passing(self, walk: Walk, now: int) -> None:
        """The insert's own walk of input + output refreshes the deepest node it matches
        whole, at its tick; the lookup's node, if another, keeps the lookup's tick (the first
        of the request). Without this call (an engine, a server) the lookup's node takes the
        insert's tick, as both are the same node whenever the output adds no whole node."""
        whole = deepest_whole(walk.path, walk.length)
        if whole is None or whole is self._looked:
            return
        if self._looked is not None:
            self._restamp(self._looked, self._base + 1)
        self._restamp(whole, self.now())

    def _restamp(self, node: Node, tick: int) -> None:
        self._stamps[node.id] = tick
        if node in self._by_recency:
            self._rank(node)

    def remove(self, node: Node) -> None:
        if self._merging is not None and self._merging[0] == node.id:
            child = self._merging[1]
            self._stamps[child.id] = max(self.stamp(child), self.stamp(node))
        self._merging = None
        self._stamps.pop(node.id, None)
        super().remove(node)

    def bind_cost(self, node_flops: NodeCost) -> None:
        if not isinstance(node_flops, SpecNodeCost):
            raise TypeError("MarconiEviction reads state and KV sizes off a SpecNodeCost")
        super().bind_cost(node_flops)
        self._state_bytes = node_flops.state_bytes
        self._kv_bytes_per_token = sum(node_flops.kv_page_bytes)

    def efficiency(self, node: Node) -> float:
        if self._cost is None:
            raise RuntimeError("MarconiEviction needs bind_cost() before use")
        path_bytes = self._state_bytes + self._kv_bytes_per_token * node.end
        return self._cost.flops_saved(node) / max(1, path_bytes)

    def _recip_weights(self) -> tuple[float, float, float, float, float]:
        """(now, ws, s_lo, wf, f_lo): u = ws * (1 / (now - r) - s_lo) + wf * (f - f_lo)."""
        r_lo, r_hi = self._by_recency.min_value(), self._by_recency.max_value()
        now = max(self.now(), r_hi + 1)  # a node stamped at the current tick is 1 tick old
        s_lo, s_hi = 1.0 / (now - r_lo), 1.0 / (now - r_hi)
        ws = 1.0 / (s_hi - s_lo) if s_hi > s_lo else 0.0
        f_lo, f_hi = self._by_efficiency.min_value(), self._by_efficiency.max_value()
        wf = self.alpha / (f_hi - f_lo) if self.alpha and f_hi > f_lo else 0.0
        return now, ws, s_lo, wf, f_lo

    def utility(self, node: Node) -> float:
        now, ws, s_lo, wf, f_lo = self._recip_weights()
        f = self._by_efficiency.value(node)
        return ws * (1.0 / (now - self._by_recency.value(node)) - s_lo) + wf * (f - f_lo)

    def victim(self) -> Node | None:
        if not self._by_recency:
            return None
        self._evicting = True  # the request's eviction call ticks the clock (once)
        node = self._pick()
        # a one-child victim merges into its child, which keeps the later stamp (`remove`)
        only_child = next(iter(node.children.values())) if len(node.children) == 1 else None
        self._merging = (node.id, only_child) if only_child is not None else None
        return node

    def _pick(self) -> Node:
        """Threshold walk over the recency and efficiency orders (u is monotone in both)."""
        now, ws, s_lo, wf, f_lo = self._recip_weights()
        if wf == 0.0 or ws == 0.0:
            first = (self._by_efficiency if ws == 0.0 and wf else self._by_recency).first()
            assert first is not None  # victim() checked the orders are not empty
            return first
        recency, efficiency = self._by_recency.entries(), self._by_efficiency.entries()
        best = (float("inf"), -1)  # (u, id): ties go to the smaller id
        for (r, r_id), (f, f_id) in zip(
            self._by_recency.keys(), self._by_efficiency.keys(), strict=True
        ):
            for node_id in (r_id, f_id):
                u = ws * (1.0 / (now - recency[node_id][0]) - s_lo)
                u += wf * (efficiency[node_id][0] - f_lo)
                if (u, node_id) < best:
                    best = (u, node_id)
            # every unseen node is at least as old as the k-th and at least as efficient
            if best[0] <= ws * (1.0 / (now - r) - s_lo) + wf * (f - f_lo):
                break
        return self._by_recency.node(best[1])
