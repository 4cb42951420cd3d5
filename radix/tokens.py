"""Token sequences packed as int32 bytes, so prefix comparison is a memcmp.

Radix matching compares long histories (up to 32k tokens per turn) on every request; comparing
Python int lists costs ~20 ns per token, `bytes` slices ~0.1 ns. Packing also validates: a
non-integer or out-of-range token id fails here, before the tree is touched.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

from mypy_extensions import mypyc_attr

_ITEM = 4  # bytes per token id (int32)


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
        try:
            packed = array("i", tokens)
        except (TypeError, OverflowError) as exc:
            raise ValueError(f"token ids must be integers in [0, 2**31): {exc}") from None
        if packed and min(packed) < 0:
            raise ValueError(f"token ids must be non-negative, got {min(packed)}")
        return cls(packed.tobytes())

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

    def head(self, pos: int = 0) -> bytes:
        """The packed id at `pos`, usable as a dict key for child lookup."""
        at = pos * _ITEM
        return self._b[at : at + _ITEM]

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
