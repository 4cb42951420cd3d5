"""Where, in one packed prefill, each in-pass capture reads its inputs (host side, per forward).

SGLang's Mamba2 mixer runs the prefill rows of a batch back to back ("packed"): row i's chunk
occupies tokens [q_i, q_i + len_i) of the packed sequence, its state before the chunk is the
request's live slot (`prefix_len_i > 0`) or zero. A capture of row i after `o` of its chunk's
tokens (flat position f = q_i + o) needs:

* conv: the last K-1 conv inputs before f. The kernel (kernels/conv_gather.py) reads them from
  the packed inputs [q_i, f) and, for the ones before q_i, from the live slot's conv state;
* SSM: the scan materialises the state entering every chunk of `chunk` packed tokens (its
  `states[k]`, at flat position k*chunk). Take the last boundary b = k*chunk with q_i < b <= f
  (a boundary inside the row, so the state is this row's) and apply the r = f - b <= chunk
  tokens after it (kernels/ssd_capture.py); with no such boundary, start from the row's own
  start state and apply its o tokens (they lie in one chunk then, since the next boundary
  after q_i lies past f). A boundary at exactly q_i is not used: the state entering that chunk
  is the row's start state, which the second case reads directly.

Every capture's tokens lie inside one scan chunk, which is what lets the kernel reuse the
scan's own per-chunk decay cumsum. All indices are checked here on the host, so the per-layer
launches need no device sync.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jenga_sglang.binding.captures import Capture
from jenga_sglang.kernels.conv_gather import NO_INIT, check_conv_requests
from jenga_sglang.kernels.ssd_capture import NO_STATE, check_ssd_captures


@dataclass(frozen=True)
class Geometry:
    """Every index list of one forward's captures, one entry per capture (destinations are
    SGLang Mamba slot ids)."""

    dst: tuple[int, ...]
    conv_start: tuple[int, ...]  # q_i
    conv_count: tuple[int, ...]  # o
    conv_init_row: tuple[int, ...]  # row whose live slot holds older inputs, or NO_INIT
    chunk_src: tuple[int, ...]  # k: the scan's state entering chunk k, or NO_STATE
    row_src: tuple[int, ...]  # row whose start state starts it, or NO_STATE
    ssm_start: tuple[int, ...]  # first packed token applied
    ssm_count: tuple[int, ...]  # tokens applied

    @property
    def reads_row_states(self) -> bool:
        """Whether a capture starts from a row's start state (the scan's initial states)."""
        return any(r != NO_STATE for r in self.row_src)


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
    conv: list[tuple[int, int, int, int]] = []  # (dst, start, count, init row)
    ssm: list[tuple[int, int, int, int]] = []  # (chunk src, row src, start, count)
    for cap in captures:
        if not (0 <= cap.row < len(extend_lens) and 1 <= cap.offset <= extend_lens[cap.row]):
            raise ValueError(f"capture {cap} outside its row ({len(extend_lens)} rows)")
        q, f = starts[cap.row], starts[cap.row] + cap.offset
        own = cap.row if prefix_lens[cap.row] > 0 else NO_STATE
        conv.append((cap.slot, q, cap.offset, own if own != NO_STATE else NO_INIT))
        k = min(f // chunk, nchunks - 1)
        if k * chunk > q:
            ssm.append((k, NO_STATE, k * chunk, f - k * chunk))
        else:
            ssm.append((NO_STATE, own, q, cap.offset))
    dst, c_start, c_count, c_init = _columns(conv, 4)
    chunk_src, row_src, s_start, s_count = _columns(ssm, 4)
    check_conv_requests(list(dst), list(c_start), list(c_count), slots, tokens)
    check_ssd_captures(
        list(chunk_src), list(row_src), list(dst), list(s_start), list(s_count),
        (nchunks, len(extend_lens), slots), tokens, chunk,
    )  # fmt: skip
    return Geometry(dst, c_start, c_count, c_init, chunk_src, row_src, s_start, s_count)


def _columns(entries: Sequence[tuple[int, ...]], width: int) -> list[tuple[int, ...]]:
    if not entries:
        return [()] * width
    return [tuple(column) for column in zip(*entries, strict=True)]
