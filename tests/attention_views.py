"""SGLang's Triton attention kernels on one layer's KV views: calls, batches, references, checks.

Shared by tests/test_attention_views.py (Triton's CPU interpreter, views built by the binding)
and scripts/gpu_attention_views.py (compiled on a GPU, views built by pool/layout.py). Nothing
here imports SGLang's pools or switches the interpreter on: the caller does both first.

A `Layer` is what SGLang's Triton backend passes for one attention layer
(sglang/srt/layers/attention/triton_backend.py): the K and V buffers its KV pool returns for
the layer, `--page-size`, and the layer's sliding window and attention sinks. The kernels are
called as `forward_extend`, `_forward_extend_unified` (--enable-deterministic-inference) and
`forward_decode` call them, with token slot ids in `kv_indices` and a sliding-window layer's
window lists (`update_sliding_window_buffer`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import torch

HQ, HKV, D = 4, 2, 16  # query heads, KV heads (GQA groups of 2), head dim
WINDOW = 24
SWS = WINDOW - 1  # SGLang's sliding_window_size for gpt-oss: config.sliding_window - 1
PAGES = (1, 16, 64)
MAX_KV_SPLITS = 8  # SGLang's default --triton-attention-num-kv-splits
EXTEND = ((0, 12), (70, 20), (130, 9))  # (prefix, new tokens) per request
DECODE = (5, 96, 150)  # tokens per request, the new one included


def load_kernels() -> SimpleNamespace:
    """SGLang's Triton attention entry points (the installed SGLang, or the copy that
    scripts/sglang-attention-ops.sh makes for a machine without it)."""
    from sglang.kernels.ops.attention import decode_attention as dec
    from sglang.kernels.ops.attention import extend_attention as ext

    return SimpleNamespace(
        extend=ext.extend_attention_fwd,
        unified=ext.extend_attention_fwd_unified,
        unified_indices=ext.build_unified_kv_indices,
        align_window=ext.align_window_kv_to_tiles,
        decode=dec.decode_attention_fwd,
    )


@dataclass(frozen=True)
class Layer:
    """One layer's K and V buffers as the backend gets them, its sliding window (-1: full
    attention) and sinks; `pages` are the engine pages its requests may take (never page 0,
    the sink)."""

    k: torch.Tensor
    v: torch.Tensor
    page: int
    pages: tuple[int, ...]
    window: int = -1
    sinks: torch.Tensor | None = None

    def contiguous(self) -> Layer:
        return replace(self, k=self.k.contiguous(), v=self.v.contiguous())

    def row_stride_ignored(self) -> Layer:
        """The same bytes read as if a row were `kv_heads x head_dim` long."""
        return replace(self, k=_entry_strided(self.k), v=_entry_strided(self.v))

    def randn(self, *shape: int, gen: torch.Generator) -> torch.Tensor:
        """Values for this layer's device and dtype (drawn on the CPU: one stream anywhere)."""
        return torch.randn(*shape, generator=gen).to(self.k.device, self.k.dtype)


#: A kernel call as a function of the layer it reads, and its float64 reference.
Kernel = tuple[Callable[[Layer], torch.Tensor], Callable[[Layer], torch.Tensor]]


def _entry_strided(view: torch.Tensor) -> torch.Tensor:
    return view.as_strided(view.shape, (HKV * D, D, 1), view.storage_offset())


def fill(layout: Any, gen: torch.Generator) -> None:
    """Distinct values in every KV row of every layer and type of a PoolLayout (neighbours
    included, so a misread row reads other values)."""
    for layers in layout.kv.values():
        for views in layers:
            for view in (views.k, views.v):
                view.copy_(torch.randn(view.shape, generator=gen))


def engine_pages(
    rows: int, page: int, large_pages: Sequence[int], per_large: int
) -> tuple[int, ...]:
    """Engine pages (rows // page of the view; 0 is the sink) inside the given large pages."""
    return tuple(p for p in range(1, rows // page) if (p - 1) // per_large in large_pages)


def _request_slots(
    layer: Layer, lengths: Sequence[int], gen: torch.Generator
) -> list[torch.Tensor]:
    """Token slot ids of each request (position t on engine page pages[t // P], slot
    t % P), on pages scattered over the pool in random order."""
    order = torch.randperm(len(layer.pages), generator=gen).tolist()
    free = [layer.pages[i] for i in order]
    slots = []
    for length in lengths:
        count = -(-length // layer.page)
        pages, free = torch.tensor(free[:count]), free[count:]
        t = torch.arange(length)
        slots.append(pages[t // layer.page] * layer.page + t % layer.page)
    return slots


def _read_start(end: int, window: int) -> int:
    """First position of the KV list a request reads up to `end`: all of it on a full layer,
    the last `window` positions on a sliding-window one (`update_sliding_window_buffer`)."""
    return 0 if window < 0 else max(0, end - window)


def _indptr(lengths: Sequence[int], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    ends = torch.tensor(list(lengths)).cumsum(0).tolist()
    return torch.tensor([0, *ends], dtype=dtype, device=device)


@dataclass(frozen=True)
class Extend:
    """A prefill batch: per request the slots of the KV it reads from the pool (`lists`,
    positions `starts[i]` on) and of its new tokens (`chunks`, positions `prefixes[i]` on)."""

    q: torch.Tensor
    k_new: torch.Tensor
    v_new: torch.Tensor
    prefixes: tuple[int, ...]
    starts: tuple[int, ...]
    lists: tuple[torch.Tensor, ...]
    chunks: tuple[torch.Tensor, ...]

    @property
    def new(self) -> list[int]:
        return [len(chunk) for chunk in self.chunks]


def _extend_batch(layer: Layer, gen: torch.Generator) -> Extend:
    slots = _request_slots(layer, [p + e for p, e in EXTEND], gen)
    starts = tuple(_read_start(p, layer.window) for p, _ in EXTEND)
    new = sum(e for _, e in EXTEND)
    return Extend(
        q=layer.randn(new, HQ, D, gen=gen),
        k_new=layer.randn(new, HKV, D, gen=gen),
        v_new=layer.randn(new, HKV, D, gen=gen),
        prefixes=tuple(p for p, _ in EXTEND),
        starts=starts,
        lists=tuple(s[a:p] for s, a, (p, _) in zip(slots, starts, EXTEND, strict=True)),
        chunks=tuple(s[p : p + e] for s, (p, e) in zip(slots, EXTEND, strict=True)),
    )


def _extend(sg: SimpleNamespace, batch: Extend, layer: Layer) -> torch.Tensor:
    """`forward_extend`'s call: new K/V passed in, the prefix (or window) read from the pool."""
    dev = layer.k.device
    out = torch.empty_like(batch.q)
    offsets = None if layer.window < 0 else torch.tensor(batch.starts, device=dev)
    sg.extend(
        batch.q,
        batch.k_new,
        batch.v_new,
        out,
        layer.k,
        layer.v,
        _indptr(batch.new, dev, torch.int64),  # qo_indptr
        _indptr([len(x) for x in batch.lists], dev, torch.int32),  # kv_indptr
        torch.cat(batch.lists).to(dev),  # kv_indices
        None,  # custom mask
        True,  # causal
        None,  # mask indptr
        max(batch.new),
        1.0,  # k scale
        1.0,  # v scale
        D**-0.5,
        logit_cap=0.0,
        sliding_window_size=layer.window,
        sinks=layer.sinks,
        window_kv_offsets=offsets,
        xai_temperature_len=-1,
        page_size=layer.page,
        extend_seq_lens_cpu=batch.new,
    )
    return out


def _unified(sg: SimpleNamespace, batch: Extend, layer: Layer) -> torch.Tensor:
    """`_forward_extend_unified`'s call: prefix and new tokens both read from the pool; a
    window layer's lists padded to absolute tiles first, as its metadata does."""
    dev, bs = layer.k.device, len(batch.lists)
    indptr = _indptr([len(x) for x in batch.lists], dev, torch.int32)
    indices, start_pos = torch.cat(batch.lists).to(dev), None
    if layer.window >= 0:
        starts = torch.tensor(batch.starts, dtype=torch.int32, device=dev)
        indptr, indices = sg.align_window(indptr, indices, starts, bs)
        prefixes = torch.tensor(batch.prefixes, dtype=torch.int32, device=dev)
        start_pos = prefixes - indptr.diff()
    new = torch.tensor(batch.new, dtype=torch.int32, device=dev)
    starts_new = _indptr(batch.new, dev, torch.int32)[:-1]
    chunks = torch.cat(batch.chunks).to(dev)
    unified_indptr, unified_indices, prefix_lens = sg.unified_indices(
        indptr, indices, starts_new, new, chunks, bs
    )
    out = torch.empty_like(batch.q)
    sg.unified(
        batch.q,
        out,
        layer.k,
        layer.v,
        1.0,
        1.0,
        _indptr(batch.new, dev, torch.int64),
        unified_indptr,
        unified_indices,
        prefix_lens.to(torch.int32),
        max(batch.new),
        sm_scale=D**-0.5,
        logit_cap=0.0,
        is_causal=True,
        sliding_window_size=layer.window,
        sinks=layer.sinks,
        window_start_pos=start_pos,
        xai_temperature_len=-1,
        page_size=layer.page,
    )
    return out


@dataclass(frozen=True)
class Decode:
    """A decode batch: per request the slots of the KV it reads (its new token's included),
    positions `starts[i]` to `ends[i] - 1`."""

    q: torch.Tensor
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    lists: tuple[torch.Tensor, ...]


def _decode_batch(layer: Layer, gen: torch.Generator) -> Decode:
    slots = _request_slots(layer, DECODE, gen)
    starts = tuple(_read_start(n, layer.window) for n in DECODE)
    return Decode(
        q=layer.randn(len(DECODE), HQ, D, gen=gen),
        starts=starts,
        ends=DECODE,
        lists=tuple(s[a:] for s, a in zip(slots, starts, strict=True)),
    )


def _decode(sg: SimpleNamespace, batch: Decode, layer: Layer) -> torch.Tensor:
    """`forward_decode`'s call: all KV read from the pool, split into KV chunks."""
    dev, bs = layer.k.device, len(batch.lists)
    out = torch.empty_like(batch.q)
    sg.decode(
        batch.q,
        layer.k,
        layer.v,
        out,
        _indptr([len(x) for x in batch.lists], dev, torch.int32),
        torch.cat(batch.lists).to(dev),
        torch.empty(bs, HQ, MAX_KV_SPLITS, D, dtype=torch.float32, device=dev),  # logits
        torch.empty(bs, HQ, MAX_KV_SPLITS, dtype=torch.float32, device=dev),  # lse
        torch.tensor([1, 3, MAX_KV_SPLITS][:bs], dtype=torch.int32, device=dev),  # splits
        MAX_KV_SPLITS,
        D**-0.5,
        1.0,
        1.0,
        logit_cap=0.0,
        sinks=layer.sinks,
        xai_temperature_len=-1,
        has_mla=False,
        use_pdl=False,
        page_size=layer.page,
        enable_lean=False,
    )
    return out


def _attend(
    q: torch.Tensor,
    q_pos: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    k_pos: torch.Tensor,
    layer: Layer,
) -> torch.Tensor:
    """float64 attention of one request: causal, within the window, with the sinks in the
    softmax denominator; K/V heads shared by groups of query heads."""
    k, v = (x.cpu().double().repeat_interleave(HQ // HKV, dim=1) for x in (keys, values))
    scores = torch.einsum("qhd,nhd->hqn", q.cpu().double(), k) * D**-0.5
    allowed = k_pos[None, :] <= q_pos[:, None]
    if layer.window >= 0:
        allowed &= q_pos[:, None] <= k_pos[None, :] + layer.window
    scores = scores.masked_fill(~allowed, float("-inf"))
    top = scores.amax(-1, keepdim=True)
    weights = (scores - top).exp()
    denominator = weights.sum(-1, keepdim=True)
    if layer.sinks is not None:
        denominator = denominator + (layer.sinks.cpu().double()[:, None, None] - top).exp()
    return torch.einsum("hqn,nhd->qhd", weights / denominator, v)


def _extend_reference(batch: Extend, layer: Layer, unified: bool) -> torch.Tensor:
    """Per request: the listed pool rows, then the new tokens (passed in, or read from the
    pool by the deterministic kernel)."""
    outs, first = [], 0
    for start, prefix, rows, chunk in zip(
        batch.starts, batch.prefixes, batch.lists, batch.chunks, strict=True
    ):
        new = slice(first, first + len(chunk))
        first = new.stop
        if unified:
            chunk = chunk.to(layer.k.device)
            k_new, v_new = layer.k[chunk], layer.v[chunk]
        else:
            k_new, v_new = batch.k_new[new], batch.v_new[new]
        rows = rows.to(layer.k.device)
        keys = torch.cat([layer.k[rows], k_new])
        values = torch.cat([layer.v[rows], v_new])
        k_pos = torch.arange(start, prefix + len(chunk))
        outs.append(_attend(batch.q[new], k_pos[-len(chunk) :], keys, values, k_pos, layer))
    return torch.cat(outs)


def _decode_reference(batch: Decode, layer: Layer) -> torch.Tensor:
    outs = []
    for i, (start, end, rows) in enumerate(zip(batch.starts, batch.ends, batch.lists, strict=True)):
        rows = rows.to(layer.k.device)
        k_pos = torch.arange(start, end)
        q_pos = torch.tensor([end - 1])
        outs.append(_attend(batch.q[i : i + 1], q_pos, layer.k[rows], layer.v[rows], k_pos, layer))
    return torch.cat(outs)


def runs(sg: SimpleNamespace, layer: Layer, gen: torch.Generator) -> dict[str, Kernel]:
    """The three kernels on one prefill and one decode batch of this layer's requests."""
    extend, decode = _extend_batch(layer, gen), _decode_batch(layer, gen)
    return {
        "extend": (lambda x: _extend(sg, extend, x), lambda x: _extend_reference(extend, x, False)),
        "deterministic extend": (
            lambda x: _unified(sg, extend, x),
            lambda x: _extend_reference(extend, x, True),
        ),
        "decode": (lambda x: _decode(sg, decode, x), lambda x: _decode_reference(decode, x)),
    }


def _tolerance(kv: torch.Tensor) -> float:
    """Against float64: float32 math (on a GPU Triton's float32 dot products run in TF32, a
    10-bit mantissa), or half-precision inputs rounded inside the kernel."""
    if kv.dtype != torch.float32:
        return 3e-2
    return 5e-3 if kv.is_cuda else 1e-5


def assert_read_right(sg: SimpleNamespace, layer: Layer, gen: torch.Generator) -> None:
    """Each kernel's output on the pool's views equals its output on contiguous copies of the
    same values bit for bit, and is close to the float64 reference."""
    dense = layer.contiguous()
    tol = _tolerance(layer.k)
    for name, (run, reference) in runs(sg, layer, gen).items():
        got = run(layer)
        assert torch.equal(got, run(dense)), f"{name}: pool views and contiguous copies differ"
        want = reference(dense).to(got.device, got.dtype)
        err = float((got.double() - want.double()).abs().max())
        assert torch.allclose(got, want, atol=tol, rtol=tol), f"{name}: {err:.2g} off"


def assert_misread_caught(sg: SimpleNamespace, layer: Layer, gen: torch.Generator) -> None:
    """The bytes at the contiguous row stride are other tokens' (and layers') K and V: a
    kernel that read the views as contiguous would give other outputs."""
    wrong = layer.row_stride_ignored()
    for name, (run, _) in runs(sg, layer, gen).items():
        assert not torch.equal(run(layer), run(wrong)), f"{name}: a misread went unseen"


def assert_pool_strides(layer: Layer, layers_in_group: int) -> None:
    """The premise: a row of the view spans K and V of every layer of the group (the pool's
    slot stride), V sits right after K, and the rows are not contiguous."""
    row = HKV * D
    assert layer.k.stride() == layer.v.stride() == (2 * layers_in_group * row, D, 1)
    assert layer.v.data_ptr() - layer.k.data_ptr() == row * layer.k.element_size()
    assert not layer.k.is_contiguous()
