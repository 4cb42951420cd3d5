"""Token sequences packed as int32 bytes, so prefix comparison is a memcmp.

Radix matching compares long histories (up to 32k tokens per turn) on every request; comparing
Python int lists costs ~20 ns per token, `bytes` slices ~0.1 ns. Packing also validates: a
non-integer or out-of-range token id fails here, before the tree is touched. SGLang hands its
input ids over as `array("q")`: those are narrowed with numpy in bulk (100k ids in 0.04 ms,
against 4 ms id by id), since the scheduler thread packs every prompt it matches.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

import numpy as np
from mypy_extensions import mypyc_attr

_ITEM = 4  # bytes per token id (int32)
_LOW_BYTES = bytes(range(0x80))  # high bytes of non-negative int32 ids (little-endian)
_WIDE = "bBhHiIlLqQ"  # integer array typecodes numpy reads in place


def _narrowed(ids: array[int]) -> bytes:
    """int32 bytes of an integer array, range-checked in bulk (about 0.4 ns per id)."""
    wide = np.frombuffer(ids, dtype=np.dtype(ids.typecode)) if len(ids) else np.zeros(0, np.int32)
    if len(wide) and (int(wide.min()) < 0 or int(wide.max()) >= 2**31):
        raise ValueError(
            f"token ids must be integers in [0, 2**31), got {int(wide.min())}..{int(wide.max())}"
        )
    return wide.astype("<i4", copy=False).tobytes()


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class TokenSeq:
    """An immutable sequence of token ids (int32), cheap to slice and compare.

    The ids are the first `_n` bytes of `_b`: `truncated` shortens a sequence without copying
    (a run's key loses one segment per eviction, radix/tree.py).
    """

    __slots__ = ("_b", "_n")

    def __init__(self, packed: bytes, size: int = -1) -> None:
        """`packed`: int32 token bytes; with `size`, only its first `size` bytes count."""
        self._n = len(packed) if size < 0 else size
        if self._n % _ITEM or self._n > len(packed):
            raise ValueError(
                f"packed token bytes must be a multiple of {_ITEM}, got {self._n} of {len(packed)}"
            )
        self._b = packed

    @classmethod
    def of(cls, tokens: TokenSeq | Sequence[int] | Iterable[int]) -> TokenSeq:
        """Pack and validate token ids (ints in [0, 2**31))."""
        if isinstance(tokens, TokenSeq):
            return tokens
        if isinstance(tokens, array) and tokens.typecode in _WIDE:
            return cls(_narrowed(tokens))  # SGLang's input ids: array("q"), no per-id objects
        try:
            packed = array("i", tokens)
        except (TypeError, OverflowError) as exc:
            raise ValueError(f"token ids must be integers in [0, 2**31): {exc}") from None
        raw = packed.tobytes()
        # A negative int32 has its top bit set: test the high bytes at C speed, not every id.
        if raw[_ITEM - 1 :: _ITEM].translate(None, _LOW_BYTES):
            raise ValueError(f"token ids must be non-negative, got {min(packed)}")
        return cls(raw)

    @property
    def packed(self) -> bytes:
        """The int32 bytes, as `TokenSeq(packed)` takes them."""
        return self._b if self._n == len(self._b) else self._b[: self._n]

    def __len__(self) -> int:
        return self._n // _ITEM

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TokenSeq) and self.packed == other.packed

    def __hash__(self) -> int:
        return hash(self.packed)

    def __getitem__(self, index: int) -> int:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"token index {index} out of range for {n} tokens")
        index %= n
        return int.from_bytes(self._b[index * _ITEM : (index + 1) * _ITEM], "little", signed=True)

    def head(self, pos: int = 0, size: int = 1) -> bytes:
        """The packed ids [pos, pos + size) (fewer at the end), usable as a dict key for child
        lookup: a tree of pages keys a node's children by their first page."""
        at = pos * _ITEM
        return self._b[at : min(at + size * _ITEM, self._n)]

    def slice(self, start: int, stop: int | None = None) -> TokenSeq:
        stop_b = None if stop is None else stop * _ITEM
        return TokenSeq(self.packed[start * _ITEM : stop_b])

    def truncated(self, size: int) -> TokenSeq:
        """The first `size` tokens, sharing this sequence's bytes (no copy): for a key that only
        ever shrinks, whose dropped tail is not worth freeing early."""
        return TokenSeq(self._b, min(size * _ITEM, self._n))

    def concat(self, other: TokenSeq) -> TokenSeq:
        return TokenSeq(self.packed + other.packed)

    def common_prefix(self, other: TokenSeq, offset: int = 0) -> int:
        """Length of the common prefix of self and other[offset:]."""
        a = self._b
        b = other._b
        start = offset * _ITEM
        m = min(self._n, other._n - start)
        if m <= 0:
            return 0
        if a[:m] == b[start : start + m]:
            return m // _ITEM
        lo, hi = 0, m // _ITEM  # a[:lo] matches, a[:hi] does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if a[: mid * _ITEM] == b[start : start + mid * _ITEM]:
                lo = mid
            else:
                hi = mid
        return lo

    def tolist(self) -> list[int]:
        return array("i", self.packed).tolist()

    def __repr__(self) -> str:
        ids = self.tolist()
        body = ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")
        return f"TokenSeq([{body}])"
