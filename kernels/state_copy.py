"""Batched slot-to-slot copies inside one page-major byte buffer, in a single launch.

The Jenga pool keeps every small page type in one byte buffer: small page ``i`` of a type lives at
``base + i * stride``. A Mamba state page holds several tensors of different dtypes (bf16 conv,
fp32 temporal, per layer); a KV page holds K and V. Each such tensor is a :class:`SlotView` of the
buffer. A copy job moves one slot of one view to another slot of the same view. The kernel copies
raw machine words (4, 2 or 1 bytes, the widest every offset allows), so dtypes may mix freely in
one launch and values move bit-exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import triton
import triton.language as tl

from jenga_sglang.kernels.checks import require

if TYPE_CHECKING:
    import torch

_BLOCK = 1024


@dataclass(frozen=True)
class SlotView:
    """Slots ``0..num_slots-1`` of ``nbytes`` each at byte ``base + slot * stride`` of the buffer.

    ``itemsize`` is the element size of the typed tensor this view backs (2 for bf16, 4 for fp32):
    ``base``, ``stride`` and ``nbytes`` must be multiples of it, and a slot must not overlap the
    next one (``nbytes <= stride``).
    """

    name: str
    base: int
    stride: int
    nbytes: int
    num_slots: int
    itemsize: int = 1

    def validate(self, buffer_bytes: int) -> None:
        """Raise ``ValueError`` unless the view is aligned and lies inside the buffer."""
        for field in ("base", "stride", "nbytes"):
            value = getattr(self, field)
            require(value >= 0, f"view {self.name!r}: {field}={value} is negative")
            require(
                value % self.itemsize == 0,
                f"view {self.name!r}: {field}={value} is not aligned to itemsize {self.itemsize}",
            )
        require(
            self.nbytes <= self.stride or self.num_slots <= 1,
            f"view {self.name!r}: slots overlap (nbytes={self.nbytes} > stride={self.stride})",
        )
        end = self.base + max(self.num_slots - 1, 0) * self.stride + self.nbytes
        require(
            end <= buffer_bytes,
            f"view {self.name!r}: last slot ends at byte {end} > buffer size {buffer_bytes}",
        )

    def span(self, slot: int) -> tuple[int, int]:
        """The byte range ``[start, end)`` of ``slot``."""
        start = self.base + slot * self.stride
        return start, start + self.nbytes


def slot_view_of(name: str, buffer: torch.Tensor, view: torch.Tensor) -> SlotView:
    """Describe a strided tensor view of ``buffer`` (dim 0 = slot, the rest contiguous)."""
    require(
        view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr(),
        f"view {name!r} is not a view of the buffer",
    )
    item = view.element_size()
    require(view.dim() >= 1, f"view {name!r} must have a slot dimension")
    inner = view[0] if view.shape[0] > 0 else view.new_empty(view.shape[1:])
    require(inner.is_contiguous(), f"view {name!r}: a slot must be contiguous")
    return SlotView(
        name=name,
        base=view.data_ptr() - buffer.data_ptr(),
        stride=view.stride(0) * item,
        nbytes=math.prod(view.shape[1:]) * item,
        num_slots=view.shape[0],
        itemsize=item,
    )


@triton.jit  # type: ignore[untyped-decorator]
def _copy_slots_kernel(  # type: ignore[no-untyped-def]
    buf, job_view, job_src, job_dst, view_base, view_stride, view_words, BLOCK: tl.constexpr
):
    job = tl.program_id(0)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(job_view + job)
    base = tl.load(view_base + v)
    stride = tl.load(view_stride + v)
    words = tl.load(view_words + v)
    src = tl.load(job_src + job).to(tl.int64)
    dst = tl.load(job_dst + job).to(tl.int64)
    mask = offs < words
    val = tl.load(buf + base + src * stride + offs, mask=mask)
    tl.store(buf + base + dst * stride + offs, val, mask=mask)


def _word_size(views: Sequence[SlotView]) -> int:
    g = 4
    for v in views:
        g = math.gcd(g, v.base, v.stride, v.nbytes)
    return g


def _check_jobs(views: Sequence[SlotView], jobs: Sequence[tuple[int, int, int]]) -> None:
    writes: list[tuple[int, int, int]] = []
    reads: list[tuple[int, int, int]] = []
    for j, (v, s, d) in enumerate(jobs):
        require(0 <= v < len(views), f"jobs[{j}]: view {v} is out of range [0, {len(views)})")
        for role, slot in (("src", s), ("dst", d)):
            n = views[v].num_slots
            require(
                0 <= slot < n,
                f"jobs[{j}]: {role} slot {slot} of view {views[v].name!r} is out of range [0, {n})",
            )
        if s != d:
            writes.append((*views[v].span(d), j))
            reads.append((*views[v].span(s), j))
    # A write overlapping any other write or read makes the result depend on program order.
    ranges = sorted(
        [(a, b, j, True) for a, b, j in writes] + [(a, b, j, False) for a, b, j in reads]
    )
    open_write: tuple[int, int, int] | None = None
    open_any: tuple[int, int, int, bool] | None = None
    for a, b, j, is_write in ranges:
        if open_write is not None and a < open_write[1] and open_write[2] != j:
            raise ValueError(
                f"jobs {open_write[2]} and {j} overlap: job {open_write[2]} writes "
                f"bytes [{open_write[0]}, {open_write[1]}) that job {j} touches"
            )
        if is_write and open_any is not None and a < open_any[1] and open_any[2] != j:
            raise ValueError(
                f"jobs {open_any[2]} and {j} overlap: job {j} writes bytes "
                f"[{a}, {b}) that job {open_any[2]} touches"
            )
        if is_write and (open_write is None or b > open_write[1]):
            open_write = (a, b, j)
        if open_any is None or b > open_any[1]:
            open_any = (a, b, j, is_write)


def copy_slots(
    buffer: torch.Tensor, views: Sequence[SlotView], jobs: Sequence[tuple[int, int, int]]
) -> None:
    """Run every ``(view_index, src_slot, dst_slot)`` job in one launch.

    ``buffer`` is the pool's contiguous byte buffer (any dtype; addressed in bytes). Jobs may mix
    views of different dtypes. Raises ``ValueError`` before launching on a misaligned or
    out-of-buffer view, an out-of-range slot, or jobs whose destinations overlap another job's
    source or destination (the copy would then depend on scheduling).
    """
    import torch

    require(buffer.is_contiguous(), "buffer must be contiguous")
    raw = buffer.view(-1).view(torch.uint8)
    for v in views:
        v.validate(raw.numel())
    _check_jobs(views, jobs)
    live = [job for job in jobs if job[1] != job[2]]
    if not live:
        return
    word = _word_size(views)
    # Views end inside the buffer, so trimming a ragged tail never cuts a slot.
    trimmed = raw[: raw.numel() - raw.numel() % word]
    words = trimmed.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[word])
    meta = torch.tensor(
        [[v.base // word, v.stride // word, v.nbytes // word] for v in views], dtype=torch.int64
    ).to(buffer.device)
    # Column tensors must be contiguous: the kernel indexes them as flat arrays.
    cols = torch.tensor(live, dtype=torch.int64).T.contiguous().to(buffer.device)
    max_words = max(views[v].nbytes // word for v, _, _ in live)
    grid = (len(live), triton.cdiv(max_words, _BLOCK))
    _copy_slots_kernel[grid](
        words,
        cols[0],
        cols[1],
        cols[2],
        meta[:, 0].contiguous(),
        meta[:, 1].contiguous(),
        meta[:, 2].contiguous(),
        BLOCK=_BLOCK,
    )


def copy_slot_pairs(
    buffer: torch.Tensor, views: Sequence[SlotView], pairs: Sequence[tuple[int, int]]
) -> None:
    """Copy every view of each ``(src_slot, dst_slot)`` pair (e.g. all layers' conv and temporal
    states of a live request into a checkpoint slot), in one launch."""
    copy_slots(buffer, views, [(v, s, d) for s, d in pairs for v in range(len(views))])
