"""Page types and page sets: the units a `CacheMemory` (radix/memory.py) hands out.

A page type is (kind, index): the KV pages of attention group i, or one SSM state. A set of
pages is either a bare count (`CountPages`, byte accounting only) or a list of small-page ids
(`IdPages`, real pools); both split and merge the same way, so the tree never asks which.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

from mypy_extensions import mypyc_attr


class PageKind(IntEnum):
    KV = 0
    STATE = 1


class PageType(NamedTuple):
    """A small-page type: the KV pages of one attention group, or the SSM state pages.

    A tuple of ints, so hashing and comparison stay in C: page types key the memory's counters
    on every allocation.
    """

    kind: PageKind
    group: int  # index of the layer group in ModelSpec.groups

    def __str__(self) -> str:
        return f"{self.kind.name.lower()}[{self.group}]"


# mypyc (scripts/build_compiled.py) compiles exception classes only as plain Python classes.
@mypyc_attr(native_class=False)
class OutOfMemory(RuntimeError):
    """An allocation that cannot be served even after evicting everything evictable."""


@dataclass(frozen=True)
class Usage:
    """Small pages of one type by state (for byte budgets, 1 page = 1 token / 1 state)."""

    total: int
    free: int
    evictable: int
    used: int
    page_bytes: int


@mypyc_attr(allow_interpreted_subclasses=True)
class Pages(ABC):
    """An ordered run of small pages of one type, as stored on a radix node.

    The tree only needs length, split and concatenation; page ids matter to the memory and to
    the engine (they become KV slot indices), not to the tree.
    """

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def split(self, at: int) -> tuple[Pages, Pages]:
        """Pages [0, at) and [at, len)."""

    @abstractmethod
    def concat(self, other: Pages) -> Pages:
        """self followed by other."""

    @abstractmethod
    def ids(self) -> list[int]:
        """Page ids (memories without ids raise TypeError)."""


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class CountPages(Pages):
    """Pages known only by their number (byte-budget memories)."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def split(self, at: int) -> tuple[Pages, Pages]:
        return CountPages(at), CountPages(self.n - at)

    def concat(self, other: Pages) -> Pages:
        return CountPages(self.n + len(other))

    def ids(self) -> list[int]:
        raise TypeError("a byte-budget memory hands out page counts, not page ids")

    def __repr__(self) -> str:
        return f"CountPages({self.n})"


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class IdPages(Pages):
    """Pages with real ids (the Jenga pool)."""

    __slots__ = ("_ids",)

    def __init__(self, ids: list[int]) -> None:
        self._ids = ids

    def __len__(self) -> int:
        return len(self._ids)

    def split(self, at: int) -> tuple[Pages, Pages]:
        return IdPages(self._ids[:at]), IdPages(self._ids[at:])

    def concat(self, other: Pages) -> Pages:
        return IdPages(self._ids + other.ids())

    def ids(self) -> list[int]:
        return self._ids

    def __repr__(self) -> str:
        return f"IdPages({self._ids})"
