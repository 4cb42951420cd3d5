"""SGLang's slots in and out of our tree: the page bookkeeping under the backend's contract.

SGLang computes every KV slot and Mamba slot before the tree sees it, so an insert *adopts*
the slots of a request's row (`adopt`: the tree frees those of positions it held already), and
a request whose prefix the tree already held gets its row pointed at the tree's slots
(`repoint`). Both go through `PrefixCache` (`reach`, then `store` along the same walk); nothing
here is part of SGLang's `BasePrefixCache` contract, which binding/cache/backend.py keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from jenga_sglang.binding.slots.ids import Ids, SlotPages, page_ids
from jenga_sglang.binding.slots.kv_events import HitSpanEvents
from jenga_sglang.binding.slots.sglang_slots import SglangSlots
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import Pages
from jenga_sglang.radix.rules import SlidingWindowRule
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
        self.kv_slot = cache.kv_types.index(slots.kv_type)  # the full group's index
        window = slots.window_type
        self.window_slot = None if window is None else cache.kv_types.index(window)
        # hits end at checkpoints: not on a PD decode worker, whose peer sends the states
        self.hits_at_states = slots.state_type is not None and cache.tree.spec.keeps_states
        self.events: HitSpanEvents | None = None  # set by kv_events.attach when events are on

    def adopt(
        self,
        tokens: TokenSeq,
        value: torch.Tensor | None,
        states: dict[int, int],
        start: Node | None = None,
        own_from: int | None = None,
        namespace: str | None = None,
    ) -> Adopted:
        """Insert `tokens` with the request's KV slots for [own_from, len) (the row `value`;
        before `own_from` the row holds the tree's own) and state slots valid at their
        positions (<= len), in one walk (from `start`: a node locked on the tokens' path,
        `RadixTree.walk`), in the request's `namespace`. Slots of positions the tree already
        holds are freed by it, or revive its dropped window pages. `own_from` None: only the
        slots of positions the tree lacks are handed over (SGLang's `insert`, whose caller
        frees its duplicates)."""
        if value is None or len(value) < len(tokens):
            raise ValueError(f"insert of {len(tokens)} tokens needs as many KV slots")
        bad = [p for p in states if not 0 < p <= len(tokens)]
        if bad:
            raise ValueError(f"state position {bad[0]} outside (0, {len(tokens)}]")
        memory, state_type = self.slots.memory, self.slots.state_type
        walk = self.cache.reach(tokens, start, namespace)
        host = self.cache.host  # host copies on the path give way to the request's own pages
        if host is not None and host.clear_walk(walk):
            walk = self.cache.reach(tokens, start, namespace)
        present = walk.length
        own_from = present if own_from is None else min(own_from, present)
        held = walk.checkpoints()
        refused = {p: slot for p, slot in states.items() if p in held or state_type is None}
        taken = {
            p: memory.adopt(state_type, [slot])
            for p, slot in states.items()
            if p not in refused and state_type is not None
        }
        kv = self._own_pages(value[own_from : len(tokens)])
        node = self.cache.store(tokens, walk, kv, taken, own_from, namespace)
        if self.events is not None:  # a router's view of what hits can use (slots/kv_events.py)
            taken_slots = {p: states[p] for p in taken}
            self._report(tokens, value, present, node, taken_slots, namespace)
        return Adopted(present, node, len(taken), refused)

    def _report(
        self,
        tokens: TokenSeq,
        value: torch.Tensor,
        present: int,
        node: Node,
        taken: dict[int, int],
        namespace: str | None,
    ) -> None:
        """The spans a hit can now use, to the event recorder: checkpoints (by state slot);
        without a Mamba group, with a window group the node ends from the branch point down
        (by their last page's first full slot), else every new KV page (by its first slot).
        With a window group only ends whose window the tree holds (slots/kv_events.py)."""
        assert self.events is not None
        page = self.cache.tree.page
        if self.hits_at_states:
            spans = sorted(taken.items())
        elif self.window_slot is not None:
            spans = self._window_ends(node.path_from_root(), max(present, 1), len(tokens))
        else:
            ends = range(present - present % page + page, len(tokens) + 1, page)
            spans = [(end, int(value[end - page])) for end in ends]
        if spans:
            self.events.adopted(tokens.tolist(), spans, namespace)

    def loaded(self, tokens: TokenSeq, path: Sequence[Node], namespace: str | None) -> None:
        """A host load moved nodes of `path` (a match's walk, in `namespace`) to fresh device
        slots: with a window group their full slots are pointed at the window pages loaded
        with them (slots/windows.py's invariant; positions already consistent are rewritten
        with what they hold), and with events on the recorder checks their spans."""
        if self.window_slot is not None and path:
            self._publish(path[-1], 0)
        if self.events is not None:
            self.report_loaded(tokens, path, namespace)

    def report_loaded(self, tokens: TokenSeq, path: Sequence[Node], namespace: str | None) -> None:
        """A host load moved nodes or checkpoints of `path` (a match's walk, in `namespace`)
        back to device slots: their spans to the event recorder, named as `_report` names
        them: checkpoints by state slot; without a Mamba group, with a window group node ends
        whose window the tree holds, else every page. The recorder skips those it holds: a
        span a demoted page named followed it to host and back (slots/kv_events.py), so only
        spans the load made usable anew are published (a node end a split made)."""
        assert self.events is not None
        page = self.cache.tree.page
        spans: list[tuple[int, int]] = []
        if self.hits_at_states:
            for n in path:
                spans += [(at, int(page_ids(state)[0])) for at, state in n.inner]
                if n.state is not None:
                    spans.append((n.end, int(page_ids(n.state)[0])))
        elif self.window_slot is not None:
            spans = self._window_ends([*path], 1, len(tokens))
        else:
            for n in path:
                full = page_ids(n.kv[self.kv_slot])
                spans += [(n.start + i + page, int(full[i])) for i in range(0, len(full), page)]
        spans = [(end, slot) for end, slot in spans if end <= len(tokens)]
        if spans:
            self.events.adopted(tokens.tolist(), spans, namespace)

    def _window_ends(self, path: list[Node], first: int, last: int) -> list[tuple[int, int]]:
        """A window model's spans: the ends in [first, last] of `path`'s nodes whose window
        the tree holds (a hit there keeps every window group's rule), each named by the first
        full slot of its last page."""
        page = self.cache.tree.page
        windows = [r for r in self.cache.tree.rules if isinstance(r, SlidingWindowRule)]
        return [
            (n.end, int(page_ids(n.kv[self.kv_slot])[-page]))
            for n in path
            if first <= n.end <= last and _window_holds(windows, path, n.end)
        ]

    def _own_pages(self, row: torch.Tensor) -> list[Pages]:
        """The request's slots for its own positions, one run per attention group (the tree's
        order): full slots, and the SWA slots of the live tail its window still holds (SGLang
        freed the ones before: they lead the run as tombstones). A live SWA slot before that
        tail (none in SGLang 0.5.23's frees, which run from the protected prefix up) is freed."""
        memory, slots = self.slots.memory, self.slots
        kv: list[Pages] = [SlotPages(np.zeros(0, np.int64))] * len(self.cache.kv_types)
        full = row.to(torch.int64)
        kv[self.kv_slot] = memory.adopt(slots.kv_type, full.cpu().numpy())  # adopt copies them
        if self.window_slot is not None:
            assert slots.window is not None and slots.window_type is not None
            window = slots.window.translate(full)
            dead = torch.nonzero(window == 0)
            live_from = int(dead[-1]) + 1 if dead.numel() else 0
            slots.window.release_window_of(full[:live_from])
            kv[self.window_slot] = memory.adopt(slots.window_type, window[live_from:].cpu().numpy())
        return kv

    def repoint(self, req: Any, present: int, node: Node) -> None:
        """Point the request's row at the tree's slots for [protected, present), whose own
        duplicates the insert freed; with a window group, make every full slot of the
        request's new positions name the tree's window KV (binding/slots/windows.py)."""
        protected = req.kv.cache_protected_len
        pool = self.slots.req_to_token_pool
        if present > protected:
            cached = self.path_ids(node, start=protected, stop=present)
            pool.write((req.kv.req_pool_idx, slice(protected, present)), cached)
        if self.window_slot is not None and node.end > protected:
            self._publish(node, protected)
        req.kv.cache_protected_len = 0 if node.parent is None else node.end

    def _publish(self, node: Node, start: int) -> None:
        """`WindowSlots.publish` for the path's positions [start, node.end)."""
        assert self.slots.window is not None and self.window_slot is not None
        full_parts: list[Ids] = []
        window_parts: list[Ids] = []
        n: Node | None = node
        while n is not None and n.parent is not None and n.end > start:
            tomb = n.tombstones[self.window_slot]
            lo = max(start, n.start + tomb) - n.start  # offset of the first kept window page
            window = page_ids(n.kv[self.window_slot])
            if lo < len(n.key):
                full_parts.append(page_ids(n.kv[self.kv_slot])[lo:])
                window_parts.append(window[lo - tomb :])
            n = n.parent
        if full_parts:
            device = self.slots.device
            full = torch.from_numpy(np.concatenate(full_parts)).to(device)
            pages = torch.from_numpy(np.concatenate(window_parts)).to(device)
            self.slots.window.publish(full, pages)

    def path_ids(self, node: Node, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """KV slot ids of the path's positions [start, stop) (stop: node.end by default):
        nodes above `start` are not visited (a request repointed after each chunk needs only
        what it added)."""
        parts: list[Ids] = []
        if node.parent is not None:  # not a root (a namespace's or the tree's)
            stop = node.end if stop is None else stop
            n: Node | None = node
            while n is not None and n.parent is not None and n.end > start:
                if n.start < stop:
                    ids = page_ids(n.kv[self.kv_slot])
                    parts.append(ids[max(0, start - n.start) : stop - n.start])
                n = n.parent
        joined = np.concatenate(parts[::-1]) if parts else np.zeros(0, np.int64)
        return torch.from_numpy(joined).to(self.slots.device)

    def evictable_state_ids(self) -> frozenset[int]:
        """Live Mamba slots of the tree no lock holds: the states eviction may still drop
        (none with int8 checkpoints, whose states live in a pool of their own). Every held
        state less those of locked nodes, which are found from the roots down through
        locked children only (a lock counts on every ancestor): O(states + locked nodes)."""
        slots = self.slots
        if slots.state_type is None or slots.checkpoints is not None:
            return frozenset()
        locked: set[int] = set()
        tree = self.cache.tree
        stack = [c for r in (tree.root, *tree.spaces.values()) for c in r.children.values()]
        while stack:
            node = stack.pop()
            if node.lock_ref <= 0:
                continue
            if node.state is not None:
                locked.update(page_ids(node.state).tolist())
            for _, state in node.inner:
                locked.update(page_ids(state).tolist())
            stack.extend(node.children.values())
        return slots.memory.held_ids(slots.state_type) - locked


def _window_holds(windows: list[SlidingWindowRule], path: list[Node], end: int) -> bool:
    """Whether a hit at `end` of `path` keeps every window group's rule (radix/rules.py)."""
    upto = [n for n in path if n.start < end]
    return all(rule.longest_valid(upto, end) == end for rule in windows)
