"""SGLang slot ids as numpy arrays: the pages the tree holds, and the set a memory holds.

The scheduler thread hands our cache thousands of slot ids per request (page size 1: one per
token). Kept as Python ints in lists and sets they cost ~60 ns each to convert, hash and move:
8 ms on a 128k-token path. Here a node's pages are one int64 array (`SlotPages`), sliced when
the tree splits a node and concatenated when it merges two, and the ids a memory holds are
marked in an array indexed by id (`HeldIds`), so adopting, freeing and gathering a path's ids
are a few numpy calls whatever their number. The ids reach SGLang's allocators as tensors made
from these arrays (`torch.from_numpy`), never through a Python list.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from jenga_sglang.radix.pages import Pages

Ids = npt.NDArray[np.int64]


def as_ids(ids: Iterable[int] | npt.NDArray[np.integer]) -> Ids:
    """Slot ids as a fresh int64 array (never a view of the caller's buffer, which SGLang
    may overwrite: a request row is rewritten when the request is repointed)."""
    if isinstance(ids, np.ndarray):
        return ids.astype(np.int64, copy=True).reshape(-1)
    return np.array(ids if isinstance(ids, list) else list(ids), dtype=np.int64).reshape(-1)


def page_ids(pages: Pages) -> Ids:
    """The ids of any `Pages` as an array (no conversion for `SlotPages`)."""
    if isinstance(pages, SlotPages):
        return pages.array
    return np.asarray(pages.ids(), dtype=np.int64)


class SlotPages(Pages):
    """A node's run of slot ids, as one int64 array (see the module doc)."""

    def __init__(self, array: Ids) -> None:
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def split(self, at: int) -> tuple[Pages, Pages]:
        return SlotPages(self.array[:at]), SlotPages(self.array[at:])

    def concat(self, other: Pages) -> Pages:
        return SlotPages(np.concatenate((self.array, page_ids(other))))

    def ids(self) -> list[int]:
        return self.array.tolist()  # type: ignore[no-any-return]  # numpy: list[Any]

    def __repr__(self) -> str:
        return f"SlotPages({self.array.tolist()})"


class HeldIds:
    """A set of slot ids, as a stamp per id: -1 not held, else held.

    Ids are non-negative (SGLang's) or negative (the synthetic ids a tuner replay's copy
    hands out, slots/memory.py): each sign has its own array, grown on demand.
    """

    def __init__(self) -> None:
        self._stamps = {True: np.full(0, -1, np.int32), False: np.full(0, -1, np.int32)}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, ids: Ids) -> None:
        """Hold `ids`; ValueError (nothing changed) if one is held already or given twice."""
        if len(ids) == 1:  # a state slot: scalar steps, not array calls (~10x cheaper)
            sign, at = self._place(int(ids[0]))
            stamps = self._stamps[sign]
            if at >= len(stamps):
                stamps = self._grown(sign, np.array([at]))
            if stamps[at] >= 0:
                raise ValueError(f"slots {[int(ids[0])]} adopted twice")
            stamps[at] = 0
            self._count += 1
            return
        parts = [(part, self._grown(sign, part)) for sign, part in self._parts(ids)]
        for part, stamps in parts:
            if (stamps[part] >= 0).any():
                clash = sorted(set(part[stamps[part] >= 0].tolist()))
                raise ValueError(f"slots {clash[:5]} adopted twice")
        for done, (part, stamps) in enumerate(parts):
            if len(part) == 1:
                stamps[part] = 0
                continue
            order = np.arange(len(part), dtype=np.int32)
            stamps[part] = order  # a repeated id keeps its last position only
            if not (stamps[part] == order).all():
                twice = sorted(set(part[stamps[part] != order].tolist()))
                for undo, undo_stamps in parts[: done + 1]:
                    undo_stamps[undo] = -1
                raise ValueError(f"slots {twice[:5]} adopted twice")
        self._count += len(ids)

    def remove(self, ids: Ids) -> None:
        """Stop holding `ids`; AssertionError (nothing changed) if one is not held."""
        if len(ids) == 1:
            sign, at = self._place(int(ids[0]))
            stamps = self._stamps[sign]
            if at >= len(stamps) or stamps[at] < 0:
                raise AssertionError(f"slots {[int(ids[0])]} freed but not held")
            stamps[at] = -1
            self._count -= 1
            return
        parts = [(part, self._stamps[sign]) for sign, part in self._parts(ids)]
        for part, stamps in parts:
            if int(part.max()) >= len(stamps) or (stamps[part] < 0).any():
                missing = [i for i in part.tolist() if i >= len(stamps) or stamps[i] < 0]
                raise AssertionError(f"slots {missing[:5]} freed but not held")
        for part, stamps in parts:
            stamps[part] = -1
        self._count -= len(ids)

    def ids(self) -> frozenset[int]:
        held = np.flatnonzero(self._stamps[True] >= 0).tolist()
        held += (-np.flatnonzero(self._stamps[False] >= 0)).tolist()
        return frozenset(held)

    @staticmethod
    def _place(slot: int) -> tuple[bool, int]:
        """(sign, index into that sign's array) of one id (see `_parts`)."""
        return (True, slot) if slot >= 0 else (False, -slot)

    @staticmethod
    def _parts(ids: Ids) -> Iterable[tuple[bool, Ids]]:
        """(sign, index into that sign's array): synthetic id -k sits at k."""
        if not len(ids):
            return ()
        if int(ids.min()) >= 0:
            return ((True, ids),)
        negative = ids < 0
        parts = ((True, ids[~negative]), (False, -ids[negative]))
        return tuple((sign, part) for sign, part in parts if len(part))

    def _grown(self, sign: bool, part: Ids) -> npt.NDArray[np.int32]:
        stamps = self._stamps[sign]
        top = int(part.max()) + 1
        if top > len(stamps):
            grown = np.full(max(top, 2 * len(stamps)), -1, np.int32)
            grown[: len(stamps)] = stamps
            self._stamps[sign] = stamps = grown
        return stamps
