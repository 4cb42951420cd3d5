"""Where, in one packed prefill, each in-pass capture reads its inputs (host side, per forward).

SGLang's Mamba2 mixer runs the prefill rows of a batch back to back ("packed"): row i's chunk
occupies tokens [q_i, q_i + len_i) of the packed sequence, its state before the chunk is the
request's live slot (`prefix_len_i > 0`) or zero. A capture of row i after `o` of its chunk's
tokens (flat position f = q_i + o) needs:

* conv: the last K-1 conv inputs before f. The kernel (kernels/conv_gather.py) reads them from
  the packed inputs [q_i, f) and, for the ones before q_i, from the live slot's conv state;
* SSM: the scan materialises the state entering every chunk of `chunk` packed tokens (its
  `states[k]`, at flat position k*chunk). Take the last boundary b = k*chunk with q_i < b <= f
  (a boundary inside the row, so the state is this row's) and roll forward the r = f - b < chunk
  remaining tokens (kernels/roll_forward.py); with no such boundary, roll from the row's own
  start state over r = o tokens (o < chunk then, since the next boundary after q_i lies past f).
  A boundary at exactly q_i is not used: the state entering that chunk is the row's start
  state, which the second group reads directly.

All indices are checked here on the host, so the per-layer launches need no device sync.
"""

from __future__ import annotations

from dataclasses import dataclass

from jenga_sglang.binding.captures import Capture
from jenga_sglang.kernels.conv_gather import NO_INIT, check_conv_requests
from jenga_sglang.kernels.roll_forward import NO_SOURCE, check_roll_requests


@dataclass(frozen=True)
class Roll:
    """One roll-forward launch: per capture, source row/chunk, destination, packed token range."""

    src: tuple[int, ...]
    dst: tuple[int, ...]
    start: tuple[int, ...]
    count: tuple[int, ...]


@dataclass(frozen=True)
class Geometry:
    """Every index list of one forward's captures (destinations are SGLang Mamba slot ids)."""

    dst: tuple[int, ...]
    conv_start: tuple[int, ...]  # q_i
    conv_count: tuple[int, ...]  # o
    conv_init_row: tuple[int, ...]  # row whose live slot holds older inputs, or NO_INIT
    from_chunks: Roll  # src = chunk index k of the scan's states
    from_start: Roll  # src = row of the scan's initial states, or NO_SOURCE (zero state)


def plan_geometry(
    captures: tuple[Capture, ...],
    prefix_lens: list[int],
    extend_lens: list[int],
    chunk: int,
    slots: int,
) -> Geometry:
    """Index lists for `captures` of a packed prefill with these rows (module doc).

    `slots` is the size of the Mamba pool's first dimension (destinations must lie in it).
    Raises ValueError on an inconsistent capture (a bug upstream), before any launch.
    """
    starts = [0]
    for n in extend_lens:
        starts.append(starts[-1] + n)
    tokens = starts[-1]
    nchunks = -(-tokens // chunk)
    dst, c_start, c_count, c_init = [], [], [], []
    chunks: list[tuple[int, int, int, int]] = []  # (src, dst, start, count) per launch entry
    own: list[tuple[int, int, int, int]] = []
    for cap in captures:
        if not (0 <= cap.row < len(extend_lens) and 1 <= cap.offset <= extend_lens[cap.row]):
            raise ValueError(f"capture {cap} outside its row ({len(extend_lens)} rows)")
        q, f = starts[cap.row], starts[cap.row] + cap.offset
        has_start = prefix_lens[cap.row] > 0
        dst.append(cap.slot)
        c_start.append(q)
        c_count.append(cap.offset)
        c_init.append(cap.row if has_start else NO_INIT)
        k = min(f // chunk, nchunks - 1)
        if k * chunk > q:
            chunks.append((k, cap.slot, k * chunk, f - k * chunk))
        else:
            own.append((cap.row if has_start else NO_SOURCE, cap.slot, q, cap.offset))
    check_conv_requests(dst, c_start, c_count, slots, tokens)
    from_chunks, from_start = _roll(chunks), _roll(own)
    check_roll_requests(*_lists(from_chunks), (nchunks, slots), tokens)
    check_roll_requests(*_lists(from_start), (len(extend_lens), slots), tokens)
    return Geometry(
        tuple(dst), tuple(c_start), tuple(c_count), tuple(c_init), from_chunks, from_start
    )


def _roll(entries: list[tuple[int, int, int, int]]) -> Roll:
    if not entries:
        return Roll((), (), (), ())
    src, dst, start, count = zip(*entries, strict=True)
    return Roll(src, dst, start, count)


def _lists(roll: Roll) -> tuple[list[int], list[int], list[int], list[int]]:
    return list(roll.src), list(roll.dst), list(roll.start), list(roll.count)
