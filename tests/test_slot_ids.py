"""Slot ids as arrays (binding/slots/ids.py): a held set that refuses double adoption and
frees of ids it does not hold, and pages that split and merge like `IdPages`."""

from __future__ import annotations

import numpy as np
import pytest

from jenga_sglang.binding.slots.ids import HeldIds, SlotPages, page_ids
from jenga_sglang.radix.pages import IdPages


def test_held_ids_refuse_clashes_and_change_nothing() -> None:
    held = HeldIds()
    held.add(np.array([3, 5, 9]))
    held.add(np.array([-1, -2]))  # a tuner copy's synthetic ids
    assert len(held) == 5 and held.ids() == {3, 5, 9, -1, -2}
    for twice in ([5], [-1], [7, 5], [7, 8, 7], [-3, 4, -3]):
        with pytest.raises(ValueError, match="adopted twice"):
            held.add(np.array(twice))
    assert held.ids() == {3, 5, 9, -1, -2} and len(held) == 5
    for stray in ([3, 4], [100], [-7]):
        with pytest.raises(AssertionError, match="not held"):
            held.remove(np.array(stray))
    held.remove(np.array([3, -2]))
    held.remove(np.array([-1]))
    held.add(np.array([-1]))  # one id at a time takes scalar steps: same answers
    held.add(np.array([1000, 3]))  # grows its array; a freed id can come back
    assert held.ids() == {3, 5, 9, -1, 1000} and len(held) == 5


def test_slot_pages_split_and_merge_like_id_pages() -> None:
    head, tail = SlotPages(np.arange(5)).split(2)
    assert head.ids() == [0, 1] and tail.ids() == [2, 3, 4] and len(tail) == 3
    assert tail.concat(IdPages([7])).ids() == [2, 3, 4, 7]
    assert IdPages([7]).concat(tail).ids() == [7, 2, 3, 4]
    assert page_ids(IdPages([1, 2])).tolist() == [1, 2]
