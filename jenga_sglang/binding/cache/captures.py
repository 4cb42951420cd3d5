"""Destination slots of the SSM checkpoints captured inside the prefill pass.

Our admission plans exact checkpoint positions for each request at `match_prefix` (the branch
point, the prompt end). When SGLang builds an extend batch (`ScheduleBatch.prepare_for_extend`),
every planned position p that this chunk computes, `prefix_len < p <= extend_end`, gets a fresh
Mamba slot here; the forward writes the conv and SSM state after exactly the tokens [0, p) into
it (binding/capture/forward.py, capture/gdn.py), and the checkpoint after the chunk hands it
to the tree:

    prefix_len ...... p1 ...... p2 ...... extend_end      one chunk, one forward
                      |slot a   |slot b                   written during the forward
    checkpoint(up_to=extend_end): the tree adopts a at p1, b at p2 (or frees them)

No chunk is cut and no round is added. A slot is owned here from its allocation until the
checkpoint takes it (`take`) or the request leaves without one (`drop`: abort, retraction), so
nothing leaks. A slot holds a state only once every state layer of the model has written its
part; a batch whose forward did not reach all of them (layers whose kernels we do not extend, a
prefill kernel we do not hook) leaves slots unwritten or half written, and `take` frees those
instead of handing garbage to the tree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Capture:
    """One state to capture: row `row` of the batch, after `offset` tokens of its chunk."""

    row: int
    offset: int  # p - prefix_len, in [1, extend_len]
    slot: int  # destination Mamba slot (SGLang id)


@dataclass
class BatchCaptures:
    """What one extend batch must capture, and how far its forward got: `layers` is the number
    of state layers the forward must write (set when the forward starts), `written` how many
    did (every capture of the batch, conv and SSM state)."""

    captures: tuple[Capture, ...]
    layers: int = 0
    written: int = 0

    @property
    def served(self) -> bool:
        """Whether the forward wrote every capture in every state layer."""
        return self.layers > 0 and self.written >= self.layers


@dataclass
class _Pending:
    position: int
    slot: int
    batch: BatchCaptures = field(repr=False)
    tokens: Sequence[int] = field(repr=False)  # the request's ids (a reference, not a copy)


@dataclass(frozen=True)
class Taken:
    """Slots handed over at a checkpoint: written ones by position, and unwritten ones."""

    states: dict[int, int]  # position -> slot holding the state after [0, position)
    unserved: int  # captures whose forward did not write them (freed)


class PendingCaptures:
    """Capture slots by request id, from batch building to the checkpoint after the forward.

    `alloc()` returns a fresh Mamba slot id or None (none free even after eviction: that
    position is then not captured); `free(ids)` gives slots back to SGLang's allocator.
    """

    def __init__(self, alloc: Callable[[], int | None], free: Callable[[list[int]], None]) -> None:
        self._alloc, self._free = alloc, free
        self._pending: dict[str, list[_Pending]] = {}
        self.planned = 0  # positions given a slot (cumulative)
        self.skipped = 0  # positions with no slot free (cumulative)
        self.unserved = 0  # slots freed unwritten (cumulative)
        self.taken = 0  # written slots handed to a checkpoint (cumulative)

    def plan(self, rows: Iterable[Row]) -> BatchCaptures | None:
        """`rows`: (rid, prefix_len, extend_end, planned positions, token ids) per batch row."""
        captures: list[Capture] = []
        batch = BatchCaptures(())
        for row, (rid, start, end, positions, tokens) in enumerate(rows):
            for p in positions:
                if not start < p <= end:
                    continue
                slot = self._alloc()
                if slot is None:
                    self.skipped += 1
                    continue
                captures.append(Capture(row, p - start, slot))
                self._pending.setdefault(rid, []).append(_Pending(p, slot, batch, tokens))
        if not captures:
            return None
        batch.captures = tuple(captures)
        self.planned += len(captures)
        return batch

    def take(self, rid: str, up_to: int) -> Taken:
        """The written slots of positions <= up_to (ascending), removed from the pending set."""
        pending = self._pending.pop(rid, [])
        now = [c for c in pending if c.position <= up_to]
        later = [c for c in pending if c.position > up_to]
        if later:
            self._pending[rid] = later
        unserved = [c.slot for c in now if not c.batch.served]
        if unserved:
            self._free(unserved)
            self.unserved += len(unserved)
        states = {c.position: c.slot for c in now if c.batch.served}
        self.taken += len(states)
        return Taken(states, len(unserved))

    def drop(self, rid: str) -> None:
        """The request leaves without a checkpoint: its pending slots go back."""
        pending = self._pending.pop(rid, [])
        if pending:
            self._free([c.slot for c in pending])

    def lost(self) -> int:
        """Planned positions not captured (cumulative): no slot free, or not served."""
        return self.skipped + self.unserved

    def in_flight(self) -> Iterator[tuple[int, Sequence[int]]]:
        """(position, token ids) of every capture planned and not yet handed to the tree."""
        for pending in self._pending.values():
            for c in pending:
                yield c.position, c.tokens

    def held(self) -> int:
        """Slots owned here now (allocated, not yet taken or dropped)."""
        return sum(len(v) for v in self._pending.values())

    def __contains__(self, rid: object) -> bool:
        return rid in self._pending


Row = tuple[str, int, int, tuple[int, ...], Sequence[int]]


def batch_rows(reqs: Iterable[Any], positions_of: Callable[[str], tuple[int, ...]]) -> list[Row]:
    """(rid, prefix_len, extend_end, planned positions, token ids) of each extend-batch row."""
    return [
        (r.rid, int(r.prefix_len), int(r.extend_end), positions_of(r.rid),
         r.full_untruncated_fill_ids)
        for r in reqs
    ]  # fmt: skip
