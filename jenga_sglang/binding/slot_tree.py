"""SGLang's slots in and out of our tree: the page bookkeeping under the backend's contract.

SGLang computes every KV slot and Mamba slot before the tree sees it, so an insert *adopts*
the slots of a request's row (`adopt`), and a request whose prefix the tree already held gets
its row pointed at the tree's slots (`repoint`, which frees the row's duplicates). Both go
through `PrefixCache` (`reach`, then `store` along the same walk); nothing here is part of
SGLang's `BasePrefixCache` contract, which binding/backend.py keeps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from jenga_sglang.binding.sglang_slots import SglangSlots
from jenga_sglang.binding.slot_ids import Ids, page_ids
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.tokens import TokenSeq


class Adopted:
    """What an insert of slots did: `present` tokens were cached before it, `node` ends at
    the key's end, `admitted` states were taken and `refused` were not (position -> slot: a
    checkpoint was already there), which stay the caller's to free."""

    __slots__ = ("admitted", "node", "present", "refused")

    def __init__(self, present: int, node: Node, admitted: int, refused: dict[int, int]) -> None:
        self.present, self.node, self.admitted, self.refused = present, node, admitted, refused


class SlotTree:
    """The tree of `cache` over the slots of `slots` (SGLang's pools)."""

    def __init__(self, cache: PrefixCache, slots: SglangSlots) -> None:
        self.cache, self.slots = cache, slots
        self.kv_slot = cache.kv_types.index(slots.kv_type)  # its attention group's index

    def adopt(
        self,
        tokens: TokenSeq,
        value: torch.Tensor | None,
        states: dict[int, int],
        start: Node | None = None,
    ) -> Adopted:
        """Adopt KV slots for [present, len) and state slots valid at their positions (<= len),
        in one walk (from `start`: a node locked on the tokens' path, `RadixTree.walk`)."""
        if value is None or len(value) < len(tokens):
            raise ValueError(f"insert of {len(tokens)} tokens needs as many KV slots")
        bad = [p for p in states if not 0 < p <= len(tokens)]
        if bad:
            raise ValueError(f"state position {bad[0]} outside (0, {len(tokens)}]")
        memory, state_type = self.slots.memory, self.slots.state_type
        walk = self.cache.reach(tokens, start)
        present = walk.length
        new_ids = value[present : len(tokens)].cpu().numpy()  # adopt copies them
        kv = [memory.adopt(self.slots.kv_type, new_ids)]
        held = walk.checkpoints()
        refused = {p: slot for p, slot in states.items() if p in held or state_type is None}
        taken = {
            p: memory.adopt(state_type, [slot])
            for p, slot in states.items()
            if p not in refused and state_type is not None
        }
        node = self.cache.store(tokens, walk, kv, taken)
        return Adopted(present, node, len(taken), refused)

    def repoint(self, req: Any, present: int, node: Node) -> None:
        """Free the request's duplicates of cached KV and point its row at the tree's slots.
        Only [protected, present) changes: the row before is the tree's already, and the tree
        adopted the row's own slots past `present`."""
        protected = req.kv.cache_protected_len
        if present > protected:
            pool = self.slots.req_to_token_pool
            row = pool.req_to_token[req.kv.req_pool_idx]
            self.slots.allocator.free(row[protected:present].to(torch.int64))
            cached = self.path_ids(node, start=protected, stop=present)
            pool.write((req.kv.req_pool_idx, slice(protected, present)), cached)
        req.kv.cache_protected_len = 0 if node is self.cache.root else node.end

    def path_ids(self, node: Node, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """KV slot ids of the path's positions [start, stop) (stop: node.end by default):
        nodes above `start` are not visited (a request repointed after each chunk needs only
        what it added)."""
        parts: list[Ids] = []
        root = self.cache.root
        if node is not root:
            stop = node.end if stop is None else stop
            n: Node | None = node
            while n is not None and n is not root and n.end > start:
                if n.start < stop:
                    ids = page_ids(n.kv[self.kv_slot])
                    parts.append(ids[max(0, start - n.start) : stop - n.start])
                n = n.parent
        joined = np.concatenate(parts[::-1]) if parts else np.zeros(0, np.int64)
        return torch.from_numpy(joined).to(self.slots.device)
