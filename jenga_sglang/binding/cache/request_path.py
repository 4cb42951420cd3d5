"""The request path of the SGLang backend: a request's checkpoints and its release.

SGLang calls `checkpoint` after a prefill chunk and when a request finishes, and `on_release`
when it leaves. A checkpoint inserts the request's KV up to where it computed, with the states
our admission planned (captured in-pass, binding/cache/captures.py, or handed over from the
request's own slot, binding/cache/mamba_state.py), points the request's row at the tree's
slots and moves its lock to the node its insert ended at. With int8 checkpoints the tree gets
quantized copies of those states (mamba_state.py `quantize`), and a finished request of an open
radix session leaves its path locked for the session (sessions.py). On a PD decode worker with
a radix cache of its own the tree keeps no states (`MambaGroup.from_peer`): each request's
arrives from the prefill side, and goes back to the pool when it finishes. `JengaRadixCache`
(backend.py) takes these methods from here, so that module keeps the rest of the
`BasePrefixCache` contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jenga_sglang.binding.cache.captures import PendingCaptures
from jenga_sglang.binding.cache.mamba_state import Captured, StateHandOver
from jenga_sglang.binding.cache.namespaces import request_namespace
from jenga_sglang.binding.cache.plans import Planned, RequestPlans
from jenga_sglang.binding.cache.sessions import SessionLocks
from jenga_sglang.binding.slots.sglang_slots import SglangSlots
from jenga_sglang.binding.slots.tree import Adopted, SlotTree
from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.tuning import AlphaTuner
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.tokens import TokenSeq


class RequestPath:
    """`checkpoint` and `on_release` of `JengaRadixCache`, over the attributes it sets."""

    cache: PrefixCache
    spec: ModelSpec
    slots: SglangSlots
    slot_tree: SlotTree
    plans: RequestPlans
    captures: PendingCaptures | None
    handover: StateHandOver | None
    sessions: SessionLocks | None
    tuner: AlphaTuner | None
    disable: bool
    req_to_token_pool: Any
    states_admitted: int
    page_size: int

    if TYPE_CHECKING:  # defined by JengaRadixCache and SGLang's BasePrefixCache

        def lock(self, node: Any) -> Any: ...

        def unlock(self, lock: Any) -> None: ...

        def sync_metrics(self) -> None: ...

    def _adopt(
        self,
        tokens: TokenSeq,
        value: Any,
        states: dict[int, int],
        start: Node | None = None,
        own_from: int | None = None,
        namespace: str | None = None,
    ) -> Adopted:
        """The tree adopts the slots in `namespace` (slots/tree.py); counted for the metrics."""
        done = self.slot_tree.adopt(tokens, value, states, start, own_from, namespace)
        self.states_admitted += done.admitted
        return done

    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        """Insert the request's KV [0, up_to) and the states our admission wants, repoint its
        row at the tree's slots, relock. States come from the captures the forward wrote
        (binding/cache/captures.py) and, at finish, the request's own state (mamba_state)."""
        finished = bool(req.finished())
        planned = self.plans.pop(req.rid) if finished else self.plans.get(req.rid)
        # Whole pages only (--page-size > 1): the request keeps its last, partial page, and
        # states planned past it stay pending until a later checkpoint covers them.
        whole = up_to - up_to % self.page_size
        inpass = self.captures.take(req.rid, whole).states if self.captures is not None else {}
        if self.disable:
            self.slots.free_states(list(inpass.values()))
            if finished and self.handover is not None:
                self.handover.release(req)
            return
        captured = self._handed_over(req, up_to, finished, planned)
        # Not offered when it lies inside the partial last page (no node can end there).
        offered = captured.position if captured is not None and captured.position <= whole else None
        states = dict(inpass)
        if captured is not None and offered is not None:
            states.setdefault(offered, int(captured.slot.reshape(-1)[0].item()))
        if whole == 0:  # less than a page: nothing to share
            if self.handover is not None:
                self.handover.settle(req, finished, captured, taken=False)
            if finished:
                self._finished(req, 0, planned, request_namespace(req))
            return
        namespace = request_namespace(req)  # the pair its match key carried (plans.py)
        row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
        tokens = planned.tokens_up_to(whole, req.full_untruncated_fill_ids)
        # The row's slots are read as they are (int32): only the new ones become ids, so a
        # long prompt's cached prefix is never copied (1 ms a checkpoint at 128k tokens).
        own = req.kv.cache_protected_len  # the row's slots before it are the tree's
        start = self._walk_start(req, whole)
        int8 = self.handover if self.handover and self.handover.checkpoints is not None else None
        if int8 is not None:  # the tree gets quantized copies; live slots stay with their owners
            states = int8.quantize(self._new_positions(states, tokens, start, namespace))
            self.slots.free_states(list(inpass.values()))
        done = self._adopt(tokens, row[:whole], states, start, own, namespace)
        refused = done.refused
        if int8 is not None:
            int8.free_checkpoints(list(refused.values()))
        else:
            lost = [slot for p, slot in refused.items() if inpass.get(p) == slot]
            self.slots.free_states(lost)  # the tree had a checkpoint there already
        if self.handover is not None:
            kept = offered is not None and offered not in refused.keys() | inpass.keys()
            self.handover.settle(req, finished, captured, taken=int8 is None and kept)
        self._repoint(req, done)
        if finished:
            if self.sessions is not None and not _aborted(req):
                self.sessions.keep(req, done.node)  # its session's next turn finds the path
            self._finished(req, len(tokens), planned, namespace)
        self.sync_metrics()

    def _new_positions(
        self, states: dict[int, int], tokens: TokenSeq, start: Node | None, namespace: str | None
    ) -> dict[int, int]:
        """`states` at positions the tree holds no checkpoint at: a duplicate is not quantized,
        so a full checkpoint pool never evicts a state for a copy the tree then refuses."""
        if not states:
            return states
        held = self.cache.reach(tokens, start, namespace).checkpoints()
        return {p: slot for p, slot in states.items() if p not in held}

    def _walk_start(self, req: Any, size: int) -> Node | None:
        """Where the request's next insert's walk begins: the deepest node of the path it
        holds locked (its match or last checkpoint) that lies within its own tokens, so the
        walk does not compare them again (`RadixTree.walk`). The match's node may extend
        past the hit (an attention-only hit ends inside an edge): its tokens there are
        another sequence's, so the walk starts above it."""
        lock = getattr(req, "lock", None)
        node = getattr(lock, "node", None)
        if not isinstance(node, Node) or node.lock_ref <= 0:
            return None
        own = min(size, int(req.kv.cache_protected_len))
        while node is not None and node.end > own:
            node = node.parent
        if node is None or node.parent is None or node.inner:
            return None
        return node

    def _handed_over(
        self, req: Any, up_to: int, finished: bool, planned: Planned
    ) -> Captured | None:
        """The request's own state offered to the tree: at finish its last state (unless the
        plan marks the end expendable); while running only on the cut path (no in-pass
        capture), where the chunk just ended at a planned position (prefill_cut)."""
        if self.handover is None or (finished and planned.expendable_from is not None):
            return None
        if not self.spec.keeps_states:  # a PD decode worker's tree: prefill sends each state
            return None
        if finished:
            return self.handover.capture(req, up_to, True)
        if self.captures is not None:
            return None
        captured = self.handover.capture(req, up_to, False, planned.positions)
        req.mamba_branching_seqlen = next((p for p in planned.positions if p > up_to), None)
        return captured

    def _finished(self, req: Any, cached_len: int, planned: Planned, namespace: str | None) -> None:
        """The request is done: its expendable tail to the policy, its sequence to the
        admission's memory and the tuner, each in the request's `namespace`. The outputs
        through its stop: a stop string or a speculative verify step may have decoded past
        it, and the user never sees those tokens."""
        inp = planned.tokens_up_to(len(req.origin_input_ids), req.origin_input_ids)
        out = TokenSeq.of(req.output_ids_through_stop)
        self.cache.finish(inp.concat(out), cached_len, planned.expendable_from, namespace)
        if self.tuner is not None:
            self.tuner.after_request(self.cache, inp, out, namespace=namespace)

    def _repoint(self, req: Any, done: Adopted) -> None:
        """Point the request's row at the tree's slots (slots/tree.py) and move its lock to
        the node its insert ended at."""
        node = done.node
        self.slot_tree.repoint(req, done.present, node)
        self.unlock(req.lock)
        req.lock = self.lock(node)
        req.last_node = node

    def on_release(self, req: Any, *, checkpointed: bool) -> None:
        """Without a checkpoint (abort, retraction) the request's Mamba slots go back."""
        self.plans.pop(req.rid)
        if self.captures is not None:
            self.captures.drop(req.rid)
        if not checkpointed and self.handover is not None:
            self.handover.release(req)
        self.sync_metrics()  # the request's lock is gone: its pages turned evictable


def _aborted(req: Any) -> bool:
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    return isinstance(req.finished_reason, FINISH_ABORT)
