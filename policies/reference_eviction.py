"""Marconi's FLOP-aware eviction with the reference's recency term (issue #16, row 10).

The reference scores recency as the min-max normalisation of 1 / age over the candidates, not
of the last access itself: the newest nodes spread over the whole [0, 1] range and every node
older than a few ticks sits near 0, where alpha x FLOP efficiency decides alone.

Age is counted on our clock (one tick per request) from one tick past the newest candidate's
last access; the reference ticks on every lookup, insert and eviction call, so its ages differ
by a factor of about two and an offset. The order by age is the same; the utilities are close,
not equal.
"""

from __future__ import annotations

from jenga_sglang.policies.eviction import FlopAwareEviction
from jenga_sglang.radix.node import Node


class ReciprocalRecencyEviction(FlopAwareEviction):
    """u(n) = norm(1 / (now - r_n)) + alpha * norm(f_n), now = newest candidate's r + 1."""

    def _recip_weights(self) -> tuple[float, float, float, float, float]:
        """(now, ws, s_lo, wf, f_lo): u = ws * (1 / (now - r) - s_lo) + wf * (f - f_lo)."""
        r_lo, r_hi = self._by_recency.min_value(), self._by_recency.max_value()
        now = r_hi + 1
        s_lo, s_hi = 1.0 / (now - r_lo), 1.0
        ws = 1.0 / (s_hi - s_lo) if s_hi > s_lo else 0.0
        f_lo, f_hi = self._by_efficiency.min_value(), self._by_efficiency.max_value()
        wf = self.alpha / (f_hi - f_lo) if self.alpha and f_hi > f_lo else 0.0
        return now, ws, s_lo, wf, f_lo

    def utility(self, node: Node) -> float:
        now, ws, s_lo, wf, f_lo = self._recip_weights()
        f = self._by_efficiency.value(node)
        return ws * (1.0 / (now - node.last_access) - s_lo) + wf * (f - f_lo)

    def victim(self) -> Node | None:
        """Threshold walk over the recency and efficiency orders (u is monotone in both)."""
        if not self._by_recency:
            return None
        now, ws, s_lo, wf, f_lo = self._recip_weights()
        if wf == 0.0 or ws == 0.0:
            return (self._by_efficiency if ws == 0.0 and wf else self._by_recency).first()
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
