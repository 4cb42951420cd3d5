"""Mamba state hand-over between a running SGLang request and the tree.

States are slots of SGLang's Mamba pool (`HybridReqToTokenPool.mamba_pool`). Three moments:

* **hit** (`seed`): the request gets its own live slot (allocated here if it has none) and
  `req.kv.mamba_cow_src_index` names the cached slot; SGLang's forward copies it into the live
  slot before the prefill runs (`ScheduleBatch._collect_deferred_mamba_cow_and_clear`, then the
  model runner). The hit node stays locked by the request until then. With every slot held by
  running requests no slot can be freed for it: the hit is then not used (the backend reports a
  miss, and SGLang's own admission waits for a slot), where SGLang's component asserts.
* **running checkpoint** (`capture`, unfinished): only a state our admission planned (the
  branch point, which SGLang sees as `mamba_branching_seqlen`, and the prompt end) enters the
  tree. Without the extra buffer
  (`--mamba-radix-cache-strategy no_buffer`) the live slot holds the state after exactly
  `up_to` tokens (the chunk just ended there), so it is forked into a fresh slot. With the
  extra buffer the state SGLang tracked (`mamba_last_track_seqlen`, a ping-pong slot) is donated
  when it lies at a planned position (prefill_cut aligns the chunks so that it can); the
  request gets a fresh ping-pong slot in exchange. A tracked state not donated stays named.
  With no slot to be had for the fork or the exchange, the checkpoint is not kept.
* **finish** (`capture`, finished): the request's state is handed over, not copied: its live
  slot (no buffer, state after `up_to` tokens) or its latest tracked slot (extra buffer, state
  after `mamba_last_track_seqlen` tokens, since with overlap scheduling the live slot may run
  one step ahead; the one before it, `mamba_prev_track_seqlen`, when the latest lies past
  `up_to`).

`settle` frees what the tree did not take and clears the request's fields the way SGLang's own
Mamba component does (the tracked position only after a donation), so every slot has exactly
one owner afterwards.

With `--enable-int8-mamba-checkpoint` SGLang builds its int8 `MambaCheckpointPool`
(`req_pool.mamba_ckpt_pool`) and the tree holds slots of that pool, never live ones, as
SGLang's own tree does then. A running checkpoint is not forked or donated: `quantize` stores
the state from the slot that holds it (the live slot, a tracked slot, an in-pass capture slot)
into a fresh checkpoint slot with SGLang's own quantizer, and that slot stays with its owner.
A hit names the checkpoint slot as the copy-on-write source, which SGLang's model runner
dequantizes into the request's live slot (`ModelRunner`, `mamba_ckpt_pool.load_to_active`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch

EvictStates = Callable[[int], None]


@dataclass(frozen=True)
class Captured:
    """A state offered to the tree: valid after tokens [0, position); `slot` has shape (1,)."""

    position: int
    slot: torch.Tensor
    donated: bool  # the request's own slot (finish), not a fork made for the tree
    keep_idx: int | None = None  # extra buffer: the ping-pong entry it came from


class StateHandOver:
    """Moves Mamba pool slots between requests and the tree (see module doc).

    `evict_states(n)` must make `n` slots of the pool the tree holds states in allocatable
    (the backend evicts its tree): live Mamba slots, or int8 checkpoint slots when SGLang
    built its checkpoint pool (`checkpoints`).
    """

    def __init__(self, req_pool: Any, extra_buffer: bool, evict_states: EvictStates) -> None:
        if extra_buffer and not getattr(req_pool, "enable_mamba_extra_buffer", False):
            raise ValueError(
                "enable_mamba_extra_buffer=True but the HybridReqToTokenPool has no extra buffer"
            )
        self.pool = req_pool
        self.extra_buffer = extra_buffer
        self.evict_states = evict_states
        self.checkpoints: Any = getattr(req_pool, "mamba_ckpt_pool", None)

    # ------------------------------------------------------------------ slots

    def try_alloc_slot(self) -> torch.Tensor | None:
        """A fresh Mamba slot, evicting tree states if needed; None if none can be freed
        (with int8 checkpoints the tree holds no live slot: evicting frees none)."""
        slot = self.pool.mamba_allocator.alloc(1)
        if slot is None and self.checkpoints is None:
            self.evict_states(1)
            slot = self.pool.mamba_allocator.alloc(1)
        return slot  # type: ignore[no-any-return]

    def quantize(self, states: dict[int, int]) -> dict[int, int]:
        """int8 checkpoints: position -> checkpoint slot holding SGLang's quantization of
        the live slot's state (module doc); positions with no checkpoint slot to be had after
        eviction are left out. The live slots are untouched."""
        stored: dict[int, int] = {}
        translate = self.pool.translate_mamba_indices
        for position, live in states.items():
            slot = self.checkpoints.alloc(1)
            if slot is None:
                self.evict_states(1)
                slot = self.checkpoints.alloc(1)
            if slot is None:
                continue  # every checkpoint slot is locked by a running request's path
            source = torch.tensor([live], dtype=torch.int64, device=slot.device)
            self.checkpoints.store_from_active(self.pool.mamba_pool, translate(source), slot)
            stored[position] = int(slot.reshape(-1)[0].item())
        return stored

    def free_checkpoints(self, ids: list[int]) -> None:
        if ids:
            device = self.checkpoints.device
            self.checkpoints.free(torch.tensor(ids, dtype=torch.int64, device=device))

    # ------------------------------------------------------------------ hit

    def seed(self, req: Any, src_slot: int) -> bool:
        """Make the request start from cached state `src_slot` (copied on the forward stream);
        False, leaving the request untouched, when it has no live slot and none can be freed
        (every slot held by running requests: the hit then cannot be used)."""
        if not req.kv.holds_mamba:
            slot = self.try_alloc_slot()
            if slot is None:
                return False
            req.kv.mamba_pool_idx = slot[0]
        device = req.kv.mamba_pool_idx.device
        req.kv.mamba_cow_src_index = torch.tensor([src_slot], dtype=torch.int64, device=device)
        req.kv.mamba_needs_clear = False
        return True

    # ------------------------------------------------------------------ checkpoints

    def capture(
        self, req: Any, up_to: int, finished: bool, planned: Collection[int] = ()
    ) -> Captured | None:
        """The state the tree may adopt at this checkpoint, or None (KV only). A running
        request's state is offered only at a position our admission `planned`."""
        if not req.kv.holds_mamba:
            return None
        if self.extra_buffer:
            return self._capture_tracked(req, up_to, finished, planned)
        live = req.kv.mamba_pool_idx.reshape(1).to(torch.int64)
        if finished:
            return Captured(up_to, live, donated=True)
        if up_to not in planned:
            return None
        if self.checkpoints is not None:
            return Captured(up_to, live, donated=True)  # quantized from the live slot
        fork = self.try_alloc_slot()
        if fork is None:
            return None  # every slot held by running requests: this checkpoint is not kept
        translate = self.pool.translate_mamba_indices
        self.pool.copy_mamba_state(translate(live), translate(fork))
        return Captured(up_to, fork.reshape(1).to(torch.int64), donated=False)

    def _capture_tracked(
        self, req: Any, up_to: int, finished: bool, planned: Collection[int]
    ) -> Captured | None:
        tracked = req.kv.mamba_last_track_seqlen
        keep = self.pool.get_mamba_ping_pong_keep_idx(req)
        if finished and tracked is not None and tracked > up_to:
            tracked, keep = self._previous_tracked(req, keep)
        if tracked is None or not 0 < tracked <= up_to:
            return None
        if finished:
            slot = req.kv.mamba_ping_pong_track_buffer[keep].reshape(1).to(torch.int64)
            return Captured(tracked, slot.clone(), donated=True, keep_idx=keep)
        if tracked not in planned:
            return None
        if self.checkpoints is not None:  # quantized from the tracked slot, which stays
            slot = req.kv.mamba_ping_pong_track_buffer[keep].reshape(1).to(torch.int64)
            return Captured(tracked, slot.clone(), donated=True, keep_idx=keep)
        fresh = self.try_alloc_slot()
        if fresh is None:
            return None  # as above; the tracked state stays named for the finish
        donated = self.pool.donate_mamba_ping_pong_slot(req, fresh)
        return Captured(tracked, donated.reshape(1).to(torch.int64), donated=False)

    def _previous_tracked(self, req: Any, keep: int) -> tuple[int | None, int]:
        """The state tracked before the latest one, in the other ping-pong slot. A finished
        request's latest state may lie past the tokens it keeps (a stop string matched
        inside the last decode steps)."""
        if self.pool.mamba_ping_pong_track_buffer_size != 2:
            return None, keep  # one slot: the latest state overwrote the previous one
        return req.kv.mamba_prev_track_seqlen, self.pool.get_mamba_ping_pong_other_idx(keep)

    def settle(self, req: Any, finished: bool, captured: Captured | None, taken: bool) -> None:
        """After the insert: free what the tree did not take; reset the request's fields."""
        if captured is not None and not taken and not captured.donated:
            self.pool.mamba_allocator.free(captured.slot)
        if finished:
            self._release_finished(req, captured if taken else None)
        elif captured is not None:
            # Extra buffer: the tracked entry now holds a fresh slot, so no tracked state is
            # named. A tracked state that was not donated stays named: its ping-pong slot
            # still holds it, and it is what the request hands over at finish if nothing
            # is tracked after it (SGLang's own component donates at every checkpoint).
            req.kv.mamba_last_track_seqlen = None
            req.kv.mamba_prev_track_seqlen = None

    def _release_finished(self, req: Any, taken: Captured | None) -> None:
        if not req.kv.holds_mamba:
            return
        if self.extra_buffer:
            keep = taken.keep_idx if taken is not None else None
            self.pool.free_mamba_cache(req, mamba_ping_pong_track_buffer_to_keep=keep)
        elif taken is None:
            self.pool.free_mamba_cache(req)
        else:
            req.kv.mamba_pool_idx = None  # the tree owns the slot now

    def release(self, req: Any) -> None:
        """A request leaves without a checkpoint (abort, retraction, cache disabled)."""
        self._release_finished(req, None)
