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

    The reference rescans every node per eviction (O(N) each). Normalisation is one affine map,
    so the victim minimises r + beta * f with beta = alpha * (r_max - r_min) / (f_max - f_min).
    We keep the candidates in three sorted orders: by r, by f, and by the blend g = r + beta0 * f
    for a reference beta0 (re-sorted only when beta drifts out of [beta0 / 2, 2 * beta0], which
    the slowly moving min/max make rare). Then the target is a positive combination of g and one
    of the single orders:

        beta >= beta0:  r + beta f = g + (beta - beta0) f
        beta <  beta0:  r + beta f = (beta / beta0) g + (1 - beta / beta0) r

    and Fagin's threshold algorithm finds its argmin: walk both orders in step; after k steps
    every unseen node scores at least the combination of the k-th keys, so we stop as soon as
    the best seen score is within that threshold. The walk ends at the latest when an order is
    exhausted (k <= N), and since g is close to the target, after a few steps in practice.
"""

from __future__ import annotations

from collections.abc import Sequence

from mypy_extensions import mypyc_attr

from jenga_sglang.policies.bypass import BypassLearner
from jenga_sglang.policies.ranking import FirstRanked, Ranked
from jenga_sglang.policies.superseded import SupersedeLearner
from jenga_sglang.radix.contracts import EvictionPolicy, NodeCost
from jenga_sglang.radix.cost import SpecNodeCost
from jenga_sglang.radix.match import Walk
from jenga_sglang.radix.node import Node


class LruEviction(EvictionPolicy):
    """Leaves only; a hit refreshes the whole path. A chain of nodes inserted together shares
    one recency, so the tree may keep it as one run (`evicts_runs`)."""

    evicts_runs = True

    def __init__(self) -> None:
        self._leaves = FirstRanked()

    def update(self, node: Node) -> None:
        # device nodes only: a node in host memory is the host tier's (radix/host.py, T5)
        if node.lock_ref == 0 and not node.children and node.parent is not None and not node.host:
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

    def passing(self, walk: Walk, now: int) -> None:
        """The reference's SGLang+ refreshes every node the insert's walk of input + output
        reaches, the one it leaves inside an edge included (as SGLang's own `match_prefix`
        stamps a node before it splits it), before it evicts."""
        self.refresh(walk.path, now)

    def victim(self) -> Node | None:
        return self._leaves.first()


@mypyc_attr(allow_interpreted_subclasses=True)
class FlopAwareEviction(EvictionPolicy):
    """Marconi's utility: normalised recency + alpha x normalised FLOP efficiency."""

    def __init__(self, alpha: float = 0.0) -> None:
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        self.alpha = alpha
        self._cost: NodeCost | None = None
        self._by_recency = Ranked()
        self._by_efficiency = Ranked()
        self._by_blend = Ranked()
        self._beta0 = 0.0

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
        if node.lock_ref or node.parent is None or node.host:  # host: the host tier's (T5)
            return False
        return not node.children or (len(node.children) == 1 and node.state is not None)

    def update(self, node: Node) -> None:
        if self.is_candidate(node):
            self._rank(node)
        else:
            self._discard(node)

    def _rank(self, node: Node) -> None:
        """Put the node in the utility orders at its current recency and efficiency."""
        f = self.efficiency(node)
        self._by_recency.put(node, node.last_access)
        self._by_efficiency.put(node, f)
        self._by_blend.put(node, node.last_access + self._beta0 * f)

    def remove(self, node: Node) -> None:
        self._discard(node)

    def _discard(self, node: Node) -> None:
        """Take the node out of every candidate order (it may stay in the tree)."""
        self._unrank(node)

    def _unrank(self, node: Node) -> None:
        """Take the node out of the utility orders (one membership test for most nodes,
        which are in none)."""
        if node in self._by_recency:
            self._by_recency.discard(node)
            self._by_efficiency.discard(node)
            self._by_blend.discard(node)

    def refresh(self, path: Sequence[Node], now: int) -> None:
        deepest = path[-1]
        deepest.last_access = now
        if deepest in self._by_recency:
            self._by_recency.put(deepest, now)
            f = self._by_efficiency.value(deepest)
            self._by_blend.put(deepest, now + self._beta0 * f)

    def utility(self, node: Node) -> float:
        wr, r_lo, wf, f_lo = self._weights()
        return wr * (node.last_access - r_lo) + wf * (self._by_efficiency.value(node) - f_lo)

    def _weights(self) -> tuple[float, float, float, float]:
        """u = wr * (r - r_lo) + wf * (f - f_lo): min-max normalisation as one affine map."""
        r_lo, r_hi = self._by_recency.min_value(), self._by_recency.max_value()
        f_lo, f_hi = self._by_efficiency.min_value(), self._by_efficiency.max_value()
        wr = 1.0 / (r_hi - r_lo) if r_hi > r_lo else 0.0
        wf = self.alpha / (f_hi - f_lo) if self.alpha and f_hi > f_lo else 0.0
        return wr, r_lo, wf, f_lo

    def victim(self) -> Node | None:
        if not self._by_recency:
            return None
        wr, r_lo, wf, f_lo = self._weights()
        if wf == 0.0 or wr == 0.0:
            return (self._by_efficiency if wr == 0.0 and wf else self._by_recency).first()
        beta = wf / wr
        if not self._beta0 / 2 <= beta <= 2 * self._beta0:
            self._rebase(beta)
        recency, efficiency = self._by_recency.entries(), self._by_efficiency.entries()
        if beta >= self._beta0:
            other, w_blend, w_other = self._by_efficiency, 1.0, beta - self._beta0
        else:
            other, w_blend, w_other = self._by_recency, beta / self._beta0, 1 - beta / self._beta0
        best = (float("inf"), -1)  # (u, id): ties go to the smaller id
        for (g, g_id), (v, v_id) in zip(self._by_blend.keys(), other.keys(), strict=True):
            for node_id in (g_id, v_id):
                u = wr * (recency[node_id][0] - r_lo) + wf * (efficiency[node_id][0] - f_lo)
                if (u, node_id) < best:
                    best = (u, node_id)
            # every unseen node has r + beta f >= w_blend * g + w_other * v
            if best[0] <= wr * (w_blend * g + w_other * v - r_lo) - wf * f_lo:
                break
        return self._by_recency.node(best[1])

    def _rebase(self, beta: float) -> None:
        """Re-sort the blended order for a new reference beta0 (amortised: beta moves slowly)."""
        self._beta0 = beta
        efficiency = self._by_efficiency.value
        self._by_blend.reset(
            [(node, r + beta * efficiency(node)) for r, node in self._by_recency.ascending()]
        )


class JengaEviction(FlopAwareEviction):
    """FLOP-aware eviction that first drops expendable and abandoned tails, then superseded
    checkpoints.

    Candidates are unlocked leaves and unlocked inner nodes holding a state.

    * Expendable tails (`expend`): what the admission expects no later request to reuse (the
      part of a rewriting request's sequence past its own branch point). Least recently used
      first. A hit through one, or a state checkpointed at its end, proves the admission
      wrong: the node rejoins the ordinary order (`revived_expendable` counts those).
    * Abandoned tails (`policies/bypass.py`): what a request left behind when it diverged inside
      a cached sequence, once a control sample shows such tails are not hit again on this
      workload. Least recently used first.

    * Superseded: a one-child node with a state that the requests passing this way no longer
      resume from, because a deeper checkpoint serves them: its child ends in a state that has
      been hit (in an agent trajectory, the previous branch point once the next one is in use),
      or it was never a junction and a request resumed from it and went on below (the end of
      turn k of a chat once turn k + 1 has extended it). Its state costs as much as hundreds
      of tokens of KV and is rarely hit again, so these go first (least recently used among
      them). Dropping one keeps every token's KV (the child absorbs it), so no hit below it is
      lost. Whether they really are rarely hit again is measured (`SupersedeLearner`): where
      half of them are resumed from again (a tree of thoughts, whose siblings arrive after the
      first child went on below), they compete under Marconi's utility like the rest.

      A junction (a node that has had two or more children: two continuations were seen
      there) is not superseded by its own hits: a shared prefix (a system prompt, a document)
      is resumed from by one request after another, each going on into a tail nobody resumes
      from. Once the other tails are evicted it has one child, but that child says nothing about
      where the next request will resume; dropping its state would turn the next hit on the
      shared prefix into a miss.
    * Every other candidate competes under Marconi's utility. For a branch point with several
      children only its state can go (the branch and its KV stay), so a checkpoint on a popular
      junction survives while it is hit and an unpopular one does not pin a state forever.
    """

    def __init__(self, alpha: float = 0.0) -> None:
        super().__init__(alpha)
        self._superseded = FirstRanked()
        self._abandoned = FirstRanked()
        self._expendable = FirstRanked()
        self._expended: set[int] = set()  # ids of expendable nodes still in the tree
        self._junctions: set[int] = set()  # ids of nodes in the tree that had >= 2 children
        self.revived_expendable = 0
        self.bypass = BypassLearner()
        self._trusted = False  # the bypass rule the current ranking reflects
        self.supersede = SupersedeLearner()
        self._supersede_trusted = True  # the superseded tier the current ranking reflects

    @staticmethod
    def is_candidate(node: Node) -> bool:
        if node.lock_ref or node.parent is None or node.host:  # host: the host tier's (T5)
            return False
        return not node.children or node.state is not None

    def bind_cost(self, node_flops: NodeCost) -> None:
        super().bind_cost(node_flops)
        if isinstance(node_flops, SpecNodeCost) and node_flops.state_bytes:
            # the admission's short-branch bound: a quarter of a state's KV-equivalent tokens
            kv = max(1, sum(node_flops.kv_page_bytes))
            self.bypass.min_shared = round(0.25 * node_flops.state_bytes / kv)

    def is_superseded(self, node: Node) -> bool:
        if len(node.children) != 1 or node.state is None:
            return False
        if node.hit_count and node.id not in self._junctions:
            return True  # a request resumed from this state and went on below it
        (child,) = node.children.values()
        return child.state is not None and child.hit_count > 0

    def update(self, node: Node) -> None:
        if len(node.children) > 1:
            self._junctions.add(node.id)
        if node.host_state is not None:
            self.supersede.unmark(node)  # a host tier took a superseded state: its ghost
        if not self.is_candidate(node):
            self._discard(node)
            return
        if node.id in self._expended and node.state is not None:
            self._revive(node)  # a request checkpoints here after all: someone resumes here
        if node.id in self._expended:
            first = self._expendable
        elif self.bypass.goes_first(node):
            first = self._abandoned
        elif self._goes_first_superseded(node):
            first = self._superseded
        else:
            self._expendable.discard(node)
            self._abandoned.discard(node)
            self._superseded.discard(node)
            self._rank(node)
            return
        for order in (self._expendable, self._abandoned, self._superseded):
            if order is not first:
                order.discard(node)
        self._unrank(node)
        first.put(node, node.last_access)

    def _goes_first_superseded(self, node: Node) -> bool:
        if self.is_superseded(node):
            return self.supersede.mark(node)
        if self.supersede.unmark(node):
            self._retier()
        return False

    def _retier(self) -> None:
        """Re-rank every superseded node when the superseded tier switched on or off."""
        if self.supersede.trusted != self._supersede_trusted:
            self._supersede_trusted = self.supersede.trusted
            for node in self.supersede.marked():
                self.update(node)

    def remove(self, node: Node) -> None:
        self.bypass.removed(node)  # the node leaves the tree
        if self.supersede.removed(node):
            self._retier()
        self._expended.discard(node.id)
        self._junctions.discard(node.id)
        self._discard(node)

    def _discard(self, node: Node) -> None:
        self._expendable.discard(node)
        self._abandoned.discard(node)
        self._superseded.discard(node)
        self._unrank(node)

    def expend(self, nodes: Sequence[Node]) -> None:
        for node in nodes:
            self._expended.add(node.id)
            self.update(node)

    def observe(self, walk: Walk) -> None:
        self._rerank(self.bypass.observe(walk))
        if self.supersede.observe(walk):
            self._retier()

    def _rerank(self, changed: list[Node]) -> None:
        """Re-rank nodes whose mark changed; all marked ones when the rule switched on or off."""
        if self.bypass.trusted != self._trusted:
            self._trusted = self.bypass.trusted
            changed = changed + self.bypass.marked()
        for node in changed:
            self.update(node)

    def _revive(self, node: Node) -> None:
        self._expended.discard(node.id)
        self.revived_expendable += 1

    def warm(self, path: Sequence[Node], now: int) -> None:
        # recency alone: the learners below count a request's hit once, when it is taken
        # (a waiting request's hit counted every round made its own resume point look
        # superseded: one child, hit)
        super().refresh(path, now)

    def refresh(self, path: Sequence[Node], now: int) -> None:
        revived = [node for node in path if node.id in self._expended]
        for node in revived:
            self._revive(node)
        self._rerank(self.bypass.hit(path) + revived)
        deepest = path[-1]
        if self.supersede.resumed(deepest):
            self._retier()
        if deepest in self._superseded:
            deepest.last_access = now
            self._superseded.put(deepest, now)
        else:
            super().refresh(path, now)
        parent = deepest.parent
        if parent is not None and parent.parent is not None:
            self.update(parent)  # a hit below may have just superseded the parent's state

    def victim(self) -> Node | None:
        for order in (self._expendable, self._abandoned, self._superseded):
            first = order.first()
            if first is not None:
                return first
        return super().victim()

    def reuse_odds(self, node: Node) -> float:
        """0 for expendable and abandoned tails (nobody is expected to hit them); for a
        superseded checkpoint while that tier acts, the share of superseded states the
        workload resumed from again (`SupersedeLearner.revival_rate`): a host tier keeps them
        where requests come back to them and drops them where they do not; 1 otherwise."""
        if node in self._expendable or node in self._abandoned:
            return 0.0
        if node in self._superseded:
            return self.supersede.revival_rate
        return 1.0
