"""Where, in one packed prefill, each in-pass capture reads its inputs (host side, per forward).

SGLang runs the prefill rows of a batch back to back ("packed"): row i's chunk occupies tokens
[q_i, q_i + len_i) of the packed sequence, its state before the chunk is the request's live
slot (`prefix_len_i > 0`) or zero. A capture of row i after `o` of its chunk's tokens (flat
position f = q_i + o) needs:

* conv (both layer kinds): the last K-1 conv inputs before f. The kernel
  (kernels/conv_gather.py) reads them from the packed inputs [q_i, f) and, for the ones before
  q_i, from the live slot's conv state;
* Mamba2 SSM state (`plan_mamba2`): the scan materialises the state entering every chunk of
  `chunk` *packed* tokens (its `states[k]`, at flat position k*chunk). Take the last boundary
  b = k*chunk with q_i < b <= f (a boundary inside the row, so the state is this row's) and
  apply the r = f - b <= chunk tokens after it (kernels/ssd_capture.py); with no such boundary,
  start from the row's own start state and apply its o tokens (they lie in one chunk then,
  since the next boundary after q_i lies past f). A boundary at exactly q_i is not used: the
  state entering that chunk is the row's start state, which the second case reads directly;
* Gated DeltaNet state (`plan_gdn`): FLA cuts every *row* into chunks of 64 from its start and
  keeps the state entering each (`h`, row i's chunks after those of the rows before it, the
  first one being the row's start state). Take chunk c = min(o // 64, last chunk of the row)
  and apply the o - 64c <= 64 tokens after its start (kernels/gdn_capture.py).

Either way every capture's tokens lie inside one chunk, which is what lets the kernels reuse
the forward's own per-chunk decay cumsum. All indices are checked here on the host, so the
per-layer launches need no device sync.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from jenga_sglang.binding.cache.captures import Capture
from jenga_sglang.kernels.conv_gather import NO_INIT, check_conv_requests
from jenga_sglang.kernels.gdn_capture import GDN_CHUNK, check_gdn_captures
from jenga_sglang.kernels.ssd_capture import NO_STATE, chain_order, check_ssd_captures


@dataclass(frozen=True)
class Geometry:
    """Every index list of one forward's captures, one entry per capture (destinations are
    SGLang Mamba slot ids)."""

    dst: tuple[int, ...]
    conv_start: tuple[int, ...]  # q_i
    conv_count: tuple[int, ...]  # o
    conv_init_row: tuple[int, ...]  # row whose live slot holds older inputs, or NO_INIT
    chunk_src: tuple[int, ...]  # the chunk state it starts from, or NO_STATE (Mamba2 only)
    row_src: tuple[int, ...]  # Mamba2: row whose start state starts it, or NO_STATE
    ssm_start: tuple[int, ...]  # first packed token applied
    ssm_count: tuple[int, ...]  # tokens applied
    ssm_chains: tuple[int, ...] = ()  # Mamba2: offsets of the chains (kernels/ssd_capture.py)

    @property
    def reads_row_states(self) -> bool:
        """Whether a capture starts from a row's start state (the scan's initial states)."""
        return any(r != NO_STATE for r in self.row_src)


@dataclass(frozen=True)
class _Rows:
    """The packed rows of one prefill."""

    prefix_lens: Sequence[int]
    extend_lens: Sequence[int]

    @property
    def starts(self) -> list[int]:
        out = [0]
        for n in self.extend_lens:
            out.append(out[-1] + n)
        return out

    def check(self, cap: Capture) -> None:
        if not (
            0 <= cap.row < len(self.extend_lens) and 1 <= cap.offset <= self.extend_lens[cap.row]
        ):
            raise ValueError(f"capture {cap} outside its row ({len(self.extend_lens)} rows)")


def plan_mamba2(
    captures: tuple[Capture, ...],
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    chunk: int,
    slots: int,
) -> Geometry:
    """Index lists for `captures` of a packed Mamba2 prefill with these rows (module doc).

    `slots` is the size of the Mamba pool's first dimension (destinations must lie in it).
    The entries come in chain order (`chain_order`: captures of one start state side by side,
    `ssm_chains` marking where each chain begins), not in the order of `captures`. Raises
    ValueError on an inconsistent capture (a bug upstream), before any launch.
    """
    rows = _Rows(prefix_lens, extend_lens)
    starts = rows.starts
    nchunks = -(-starts[-1] // chunk)
    ssm: list[tuple[int, int, int, int]] = []  # (chunk src, row src, start, count)
    for cap in captures:
        rows.check(cap)
        q, f = starts[cap.row], starts[cap.row] + cap.offset
        k = min(f // chunk, nchunks - 1)
        if k * chunk > q:
            ssm.append((k, NO_STATE, k * chunk, f - k * chunk))
        else:
            own = cap.row if prefix_lens[cap.row] > 0 else NO_STATE
            ssm.append((NO_STATE, own, q, cap.offset))
    order, chains = chain_order(*_columns(ssm, 4))  # captures sharing a start state, chained
    geo = _with_conv(tuple(captures[i] for i in order), rows, [ssm[i] for i in order], slots)
    geo = replace(geo, ssm_chains=tuple(chains))
    check_ssd_captures(
        list(geo.chunk_src), list(geo.row_src), list(geo.dst), list(geo.ssm_start),
        list(geo.ssm_count), chains, (nchunks, len(extend_lens), slots), starts[-1], chunk,
    )  # fmt: skip
    return geo


def plan_gdn(
    captures: tuple[Capture, ...],
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    slots: int,
) -> Geometry:
    """Index lists for `captures` of a packed Gated DeltaNet prefill (module doc); raises
    ValueError on an inconsistent capture, before any launch."""
    rows = _Rows(prefix_lens, extend_lens)
    starts = rows.starts
    chunks = [-(-n // GDN_CHUNK) for n in extend_lens]
    first = [0]
    for n in chunks:
        first.append(first[-1] + n)
    ssm: list[tuple[int, int, int, int]] = []
    for cap in captures:
        rows.check(cap)
        c = min(cap.offset // GDN_CHUNK, chunks[cap.row] - 1)
        start = starts[cap.row] + c * GDN_CHUNK
        ssm.append((first[cap.row] + c, NO_STATE, start, cap.offset - c * GDN_CHUNK))
    geo = _with_conv(captures, rows, ssm, slots)
    check_gdn_captures(
        list(geo.chunk_src), list(geo.dst), list(geo.ssm_start), list(geo.ssm_count),
        (first[-1], slots), starts[-1],
    )  # fmt: skip
    return geo


def _with_conv(
    captures: tuple[Capture, ...],
    rows: _Rows,
    ssm: list[tuple[int, int, int, int]],
    slots: int,
) -> Geometry:
    """The geometry of `ssm` with every capture's conv gather (checked)."""
    starts = rows.starts
    conv = [
        (c.slot, starts[c.row], c.offset, c.row if rows.prefix_lens[c.row] > 0 else NO_INIT)
        for c in captures
    ]
    dst, c_start, c_count, c_init = _columns(conv, 4)
    check_conv_requests(list(dst), list(c_start), list(c_count), slots, starts[-1])
    chunk_src, row_src, s_start, s_count = _columns(ssm, 4)
    return Geometry(dst, c_start, c_count, c_init, chunk_src, row_src, s_start, s_count)


def _columns(entries: Sequence[tuple[int, ...]], width: int) -> list[tuple[int, ...]]:
    if not entries:
        return [()] * width
    return [tuple(column) for column in zip(*entries, strict=True)]
