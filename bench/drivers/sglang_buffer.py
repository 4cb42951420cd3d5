"""SGLang's unified byte buffer without its bytes: reserved address space, moves counted.

`--enable-unified-memory` keeps KV tokens and Mamba states in one uint8 buffer of the whole
budget (`UnifiedKVPool`). The bench drives SGLang's real allocators over it but never reads a
KV or state byte, so two things of the buffer are replaced while the pools are built:

* the allocation: `torch.empty(total_bytes, dtype=uint8)` becomes a tensor over an anonymous
  `MAP_NORESERVE` mapping. Linux's default (heuristic) overcommit refuses a plain 54 GB
  allocation on a 24 GB machine; a reserved mapping costs no memory until written;
* the start-up `raw.zero_()` (`UnifiedKVPool._initialize_raw`), which pages in every byte:
  2 GB of RSS at a 2 GB budget, and a 12 GB pool was killed at 4 GB of RSS mid-build.

Compaction's page copies are skipped by bench/drivers/sglang_pools.py (`_skip_byte_copy`) and
counted here per buffer and page size: what SGLang would have moved, the cost the Jenga pool (which
never moves a page) does not pay.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

# Linux's MAP_NORESERVE (the same value on x86-64 and arm64); Python 3.11's mmap module does
# not export it. Without it the mapping counts against the commit limit like torch.empty.
MAP_NORESERVE = 0x4000


@dataclass
class Moves:
    """Pages one buffer's compaction moved (at one page size)."""

    pages: int = 0
    bytes: int = 0
    copies: int = 0  # copy launches: one per compaction pass (or per 2^k-page slice of it)


_MOVES: dict[tuple[int, int], Moves] = {}


def record_copy(raw: torch.Tensor, pages: int, page_bytes: int) -> None:
    """Count one compaction copy of `pages` pages of `page_bytes` bytes in buffer `raw`."""
    moves = _MOVES.setdefault((raw.data_ptr(), page_bytes), Moves())
    moves.pages += pages
    moves.bytes += pages * page_bytes
    moves.copies += 1


def moves_of(raw: torch.Tensor, page_bytes: int) -> Moves:
    """What compaction moved so far in `raw`, counting pages of `page_bytes` bytes."""
    return _MOVES.get((raw.data_ptr(), page_bytes), Moves())


def forget(raw: torch.Tensor) -> None:
    """Start `raw`'s counts from zero (a new buffer may sit at a released one's address)."""
    for key in [k for k in _MOVES if k[0] == raw.data_ptr()]:
        del _MOVES[key]


def reserved_bytes(nbytes: int) -> torch.Tensor:
    """A uint8 CPU tensor of `nbytes` over reserved, never-written (so never resident) memory.

    The tensor keeps the mapping alive (torch.frombuffer holds a reference to it)."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE
    area = mmap.mmap(-1, nbytes, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(area, dtype=torch.uint8)


@contextmanager
def unpaged_buffers(min_bytes: int) -> Iterator[None]:
    """While active, the unified buffer SGLang builds is reserved address space, never zeroed.

    `torch.empty(n, dtype=torch.uint8, device="cpu")` with n >= `min_bytes` (only the unified
    buffer is that large) returns `reserved_bytes(n)`; every other call is torch's own."""
    from sglang.srt.mem_cache.unified_memory_pool import UnifiedKVPool

    empty = torch.empty
    initialize = UnifiedKVPool._initialize_raw

    def reserving_empty(*size: Any, **kwargs: Any) -> torch.Tensor:
        if _is_buffer(size, kwargs, min_bytes):
            return reserved_bytes(int(size[0]))
        return empty(*size, **kwargs)

    torch.empty = reserving_empty
    UnifiedKVPool._initialize_raw = _no_zeroing
    try:
        yield
    finally:
        torch.empty = empty
        UnifiedKVPool._initialize_raw = initialize


def _is_buffer(size: tuple[Any, ...], kwargs: dict[str, Any], min_bytes: int) -> bool:
    device = kwargs.get("device", "cpu")
    return (
        len(size) == 1
        and isinstance(size[0], int)
        and size[0] >= min_bytes
        and kwargs.get("dtype") is torch.uint8
        and torch.device(device).type == "cpu"
    )


def _no_zeroing(self: Any, raw: torch.Tensor) -> None:
    """`UnifiedKVPool._initialize_raw` without `raw.zero_()`: nothing reads the bytes, and a
    fresh anonymous mapping reads as zeros anyway."""
