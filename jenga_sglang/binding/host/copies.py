"""The bytes behind the live tier's moves, read from and written to SGLang's own pools.

KV: per attention group, its pool's per-layer K and V buffers (`k_buffer`, `v_buffer`: SGLang's
`MHATokenToKVPool`, or the Jenga pool's views of it), indexed by token slot: the full-attention
pool for the full group, and for a sliding-window model (`SWAKVPool`) the window pool for the
window group, by SWA slot; a host block keeps one tensor per buffer with a row per token, so a
split host node loads any run of its rows, and a node whose pages lie in several blocks loads
block by block. States: SGLang's `MambaPool.get_cpu_copy` /
`load_cpu_copy` (the offload pair its retraction uses), on physical slot ids
(`translate_mamba_indices`); with `--enable-int8-mamba-checkpoint` the tree's states are slots
of SGLang's `MambaCheckpointPool`, whose tensors (the quantized temporal state, its scales, the
conv windows) are copied as they are, so host memory holds the int8 bytes and a loaded
checkpoint is the demoted one, bit for bit (dequantizing happens where it always does: the
hit's copy-on-write into a live slot).

Synchronous: a demotion copies on the scheduler thread before the device slots are freed, and
a load-back before the request's match returns. On a GPU that puts both on the critical path;
SGLang's HiCache overlaps them (a write stream, layer-by-layer loads): docs/host-tier.md.

A load-back leaves the host ids holding their bytes (a clean copy, radix/host_copy.py): a later
demotion of the same pages copies nothing (`kept`).

With KV events on (`events`), each move tells the recorder which slot became which host id and
back, so a router keeps the span while its pages are on host (binding/slots/kv_events.py); a
demotion onto a clean copy moves the spans back to those ids the same way.

A pickled copy (the alpha tuner's replay) becomes `DetachedCopies`: it moves no bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from jenga_sglang.binding.host.memory import HostSlotMemory
from jenga_sglang.binding.pools.draft import remembered_draft_pool
from jenga_sglang.binding.slots.ids import page_ids
from jenga_sglang.binding.slots.kv_events import HitSpanEvents
from jenga_sglang.radix.host import HostCopies
from jenga_sglang.radix.pages import PageKind, Pages, PageType


class DetachedCopies(HostCopies):
    """A tuner replay's copies: the decisions are replayed, no byte moves."""

    def store(self, ptype: PageType, device: Pages, host: Pages) -> None:
        pass

    def load(self, ptype: PageType, host: Pages, device: Pages) -> None:
        pass

    def kept(self, ptype: PageType, device: Pages, host: Pages) -> None:
        pass


class SglangHostCopies(HostCopies):
    """Copies between SGLang's device pools and `memory`."""

    def __init__(
        self,
        buffers: Mapping[PageType, list[torch.Tensor]],
        req_to_token_pool: Any,
        memory: HostSlotMemory,
        checkpoints: Any = None,
    ) -> None:
        """`buffers`: each KV page type's K and V buffers (`kv_buffers`); `checkpoints`:
        SGLang's int8 checkpoint pool, where the tree's states live (None: they are live
        Mamba slots)."""
        self._buffers = dict(buffers)
        self._device = next(iter(self._buffers.values()))[0].device
        self._req_pool = req_to_token_pool
        self._checkpoints: list[torch.Tensor] = (
            []
            if checkpoints is None
            else [checkpoints.temporal.qdata, checkpoints.temporal.scale, *checkpoints.conv]
        )  # slot-major on dim 1, as SGLang indexes them
        self.memory = memory
        self.stored_bytes = 0  # device -> host, KV rows and state copies, cumulative
        self.loaded_bytes = 0  # host -> device
        self.events: HitSpanEvents | None = None  # set by kv_events.attach when events are on

    def store(self, ptype: PageType, device: Pages, host: Pages) -> None:
        index = self._index(device)
        if ptype.kind is PageKind.KV:
            data: Any = [buffer[index].to("cpu") for buffer in self._buffers[ptype]]
        elif self._checkpoints:
            data = [tensor[:, index].to("cpu") for tensor in self._checkpoints]
        else:
            pool = self._req_pool
            data = pool.mamba_pool.get_cpu_copy(pool.translate_mamba_indices(index))
        self.stored_bytes += _nbytes(data)
        self.memory.put(ptype, host, data)
        self.kept(ptype, device, host)  # the spans move as onto a clean copy

    def kept(self, ptype: PageType, device: Pages, host: Pages) -> None:
        # the host ids still hold the bytes (radix/host_copy.py): only the spans move there
        if self.events is not None:
            self.events.demoted(ptype, page_ids(device), page_ids(host))  # ids: no list copy

    def load(self, ptype: PageType, host: Pages, device: Pages) -> None:
        if self.events is not None:
            self.events.loaded_back(ptype, page_ids(host), page_ids(device))
        index = self._index(device)
        runs = self.memory.runs(ptype, host)
        if ptype.kind is PageKind.KV:
            for data, rows, where in runs:  # one per block the pages lie in
                picked, at = torch.from_numpy(rows), index[torch.from_numpy(where)]
                for buffer, saved in zip(self._buffers[ptype], data, strict=True):
                    rows_of = saved[picked]
                    buffer[at] = rows_of.to(self._device)
                    self.loaded_bytes += rows_of.numel() * rows_of.element_size()
            return
        ((data, _, _),) = runs  # a checkpoint: one page
        if self._checkpoints:
            for tensor, saved in zip(self._checkpoints, data, strict=True):
                tensor[:, index] = saved.to(tensor.device)
        else:
            pool = self._req_pool
            pool.mamba_pool.load_cpu_copy(data, pool.translate_mamba_indices(index))
        self.loaded_bytes += _nbytes(data)

    def _index(self, pages: Pages) -> torch.Tensor:
        return torch.from_numpy(page_ids(pages)).to(self._device)

    def __reduce__(self) -> tuple[type[DetachedCopies], tuple[()]]:
        return DetachedCopies, ()


def kv_buffers(
    kvcache: Any, kv_type: PageType, window_type: PageType | None
) -> dict[PageType, list[torch.Tensor]]:
    """The K and V buffers of each KV page type: the full-attention pool's (a hybrid model's
    `full_kv_pool`), a draft model's KV pool beside it (indexed by the same token slots), and
    with `window_type` the sliding-window pool's (`swa_kv_pool`)."""
    target = getattr(kvcache, "full_kv_pool", kvcache)
    draft = remembered_draft_pool(kvcache)
    pools = [(kv_type, target)] + ([] if draft is None else [(kv_type, draft)])
    if window_type is not None:
        pools.append((window_type, kvcache.swa_kv_pool))
    buffers: dict[PageType, list[torch.Tensor]] = {}
    for page_type, pool in pools:
        if not hasattr(pool, "k_buffer") or not hasattr(pool, "v_buffer"):
            raise NotImplementedError(
                f"--jenga-host-gb: the KV pool {type(pool).__name__} has no per-layer K and V "
                "buffers to copy (MLA and other layouts are not served by the host tier)"
            )
        buffers.setdefault(page_type, []).extend([*pool.k_buffer, *pool.v_buffer])
    slots = len(target.k_buffer[0])
    if draft is not None and any(len(b) != slots for b in draft.k_buffer):
        raise NotImplementedError(
            f"--jenga-host-gb: the draft model's KV pool {type(draft).__name__} is not over the "
            f"target's {slots} token slots, so its rows cannot move with the target's"
        )
    return buffers


def _nbytes(data: Any) -> int:
    """Bytes of the tensors in `data` (nested lists and tuples of them)."""
    if isinstance(data, torch.Tensor):
        return data.numel() * data.element_size()
    if isinstance(data, (list, tuple)):
        return sum(_nbytes(item) for item in data)
    return 0
