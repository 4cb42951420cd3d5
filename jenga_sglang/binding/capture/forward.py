"""In-pass SSM checkpoints: SGLang's prefill forward writes our captures as it runs.

This module carries a batch's captures from the scheduler to the layers and holds what the
layer kinds share; the kernel hooks of each kind are in binding/capture/mamba2.py (Mamba2:
NemotronH, Falcon-H1, Granite-4.0-H, Mamba2) and binding/capture/gdn.py (Gated DeltaNet:
Qwen3-Next, Qwen3.5). Hooks (registered through SGLang's HookRegistry by the plugin; no SGLang
file is edited):

* AFTER `ScheduleBatch.prepare_for_extend`: the batch's planned positions get destination
  slots (binding/cache/captures.py, through the backend); the batch carries them as
  `jenga_captures`;
* AFTER `ForwardBatch.init_new` and the runners' `load_batch` (which copy the forward batch
  into static buffers): the forward batch carries the same object;
* per kind, AFTER the state layers' backend builds its forward metadata: the index lists of
  every capture (binding/capture/geometry.py), checked on the host, become device tensors on
  the metadata (`build`), once per forward; then, while each state layer runs (`layer_scope`),
  two launches: the conv states before the conv overwrites the live slots (`gather_conv`,
  kernels/conv_gather.py), and the SSM states from the chunk states the layer's own chunked
  kernel computed (kernels/ssd_capture.py, kernels/gdn_capture.py).

A capture at its row's extend end (a prompt end, most often: every chat or agent turn plans
one) is the state the layer leaves in the row's live slot, so it is not computed: when the
layer returns, its live slots' conv and SSM states are copied into those destinations
(`split_tail`, `_copy_tails`). A forward whose captures are all such tails launches no capture
kernel (on the CPU interpreter the two launches were 5-20 % of a chat turn's first token).

A batch counts as served, and its slots are handed to the tree, only once every state layer
wrote every part (its kernels' two where it has inner captures, and the tail copies: counted
as the layer returns); otherwise its slots are freed unwritten (counted lost). No extra
forward, no chunk cut; outside a capturing forward each hook is one read of a context
variable.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from jenga_sglang.binding.cache.captures import BatchCaptures, Capture
from jenga_sglang.binding.capture.geometry import Geometry
from jenga_sglang.kernels.conv_gather import NO_INIT, gather_conv_states
from jenga_sglang.kernels.gdn_capture import GdnCaptures
from jenga_sglang.kernels.ssd_capture import SsdCaptures

BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"
FORWARD_BATCH = "sglang.srt.model_executor.forward_batch_info.ForwardBatch"
RUNNERS = (
    "sglang.srt.model_executor.runner.eager_runner.EagerRunner",
    "sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner",
)
ATTR = "jenga_captures"  # on ScheduleBatch / ForwardBatch / the backends' forward metadata


@dataclass(frozen=True)
class ForwardCaptures:
    """Device-side index tensors of one forward's captures (built once, read by every layer)."""

    batch: BatchCaptures
    dst: torch.Tensor  # physical slots
    conv_start: torch.Tensor
    conv_count: torch.Tensor
    conv_init: torch.Tensor  # live slot holding older conv inputs, or NO_INIT
    ssm: SsdCaptures | GdnCaptures | None  # None: no inner capture, no kernel launched
    reads_row_states: bool
    tail_src: torch.Tensor  # live (physical) slots of the rows whose extend end is captured
    tail_dst: torch.Tensor  # and their destinations


@dataclass
class _Layer:
    captures: ForwardCaptures
    cache: Any  # MambaPool.State of the running layer
    conv_done: bool = False
    ssm_done: bool = False

    @property
    def kernels(self) -> bool:
        """Whether this forward has inner captures, which the capture kernels write."""
        return self.captures.ssm is not None


_LAYER: contextvars.ContextVar[_Layer | None] = contextvars.ContextVar("jenga_layer", default=None)


def device_ids(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Host index list -> int64 tensor on `device` (copied without a sync)."""
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)


def split_tail(
    captures: tuple[Capture, ...], extend_lens: Sequence[int]
) -> tuple[tuple[Capture, ...], tuple[Capture, ...]]:
    """(inner, tail): the captures before their row's extend end, and those at it (module
    doc: a tail is the row's live state once the layer ran)."""
    tail = tuple(c for c in captures if c.offset == extend_lens[c.row])
    return tuple(c for c in captures if c.offset != extend_lens[c.row]), tail


def build(
    batch: BatchCaptures,
    geometry: Geometry | None,
    tail: tuple[Capture, ...],
    live_slots: torch.Tensor,
    translate: Callable[[torch.Tensor], torch.Tensor],
    layers: int,
    ssm_of: Callable[[torch.Tensor], SsdCaptures | GdnCaptures],
) -> ForwardCaptures:
    """Device tensors for the inner captures' `geometry` (None: there are none) and the `tail`
    captures; `live_slots` are the rows' (physical) Mamba slots, `translate` maps SGLang slot
    ids to physical ones (identity but for a unified pool), `layers` is how many state layers
    must write them, and `ssm_of(dst)` gives the layer kind's capture indices for the physical
    destinations."""
    device = live_slots.device

    def physical(ids: tuple[int, ...]) -> torch.Tensor:
        return translate(device_ids(ids, device)).to(torch.int64)

    def live(rows: tuple[int, ...]) -> torch.Tensor:
        return live_slots[device_ids(rows, device)].to(torch.int64)

    batch.layers = layers
    tail_src, tail_dst = live(tuple(c.row for c in tail)), physical(tuple(c.slot for c in tail))
    if geometry is None:
        none = device_ids((), device)
        return ForwardCaptures(batch, none, none, none, none, None, False, tail_src, tail_dst)
    rows = device_ids(geometry.conv_init_row, device)
    init = torch.where(rows >= 0, live_slots[rows.clamp(min=0)].to(torch.int64), NO_INIT)
    dst = physical(geometry.dst)
    return ForwardCaptures(
        batch=batch,
        dst=dst,
        conv_start=device_ids(geometry.conv_start, device),
        conv_count=device_ids(geometry.conv_count, device),
        conv_init=init,
        ssm=ssm_of(dst),
        reads_row_states=geometry.reads_row_states,
        tail_src=tail_src,
        tail_dst=tail_dst,
    )


@contextmanager
def layer_scope(captures: ForwardCaptures | None, cache: Any) -> Iterator[None]:
    """While a state layer runs, `cache` (its Mamba pool state) is the capture target; once it
    returns (not if it raises), the tail captures are copied and the layer counted."""
    if captures is None:
        yield
        return
    layer = _Layer(captures, cache)
    token = _LAYER.set(layer)
    try:
        yield
    finally:
        _LAYER.reset(token)
    _copy_tails(layer)
    if not layer.kernels or (layer.conv_done and layer.ssm_done):
        captures.batch.written += 1


def _copy_tails(layer: _Layer) -> None:
    """The rows' live states, as the layer left them, into their tail captures' slots."""
    c = layer.captures
    if not c.tail_dst.numel():
        return
    for conv in layer.cache.conv:
        conv[c.tail_dst] = conv[c.tail_src]
    layer.cache.temporal[c.tail_dst] = layer.cache.temporal[c.tail_src]


def current() -> _Layer | None:
    """The running state layer's captures, if this forward has inner captures to launch."""
    layer = _LAYER.get()
    return layer if layer is not None and layer.kernels else None


def gather_conv(layer: _Layer, xbc: torch.Tensor) -> None:
    """Conv state of every inner capture from the packed conv inputs `xbc` (T, D) and the
    rows' live slots, into the layer's conv pool; must run before the conv overwrites the live
    slots."""
    if layer.conv_done:
        return  # both conv bindings of the Mamba2 mixer may wrap one function: gather once
    layer.conv_done = True
    c, conv = layer.captures, layer.cache.conv[0]
    gather_conv_states(
        xbc, conv, c.dst, c.conv_start, c.conv_count, conv, c.conv_init, checked=True
    )


def layer_written(layer: _Layer) -> None:
    """The layer's kernel wrote the inner captures' SSM states (counted as the layer returns,
    `layer_scope`)."""
    layer.ssm_done = True


# ---------------------------------------------------------------- scheduler-side hooks


def after_prepare_for_extend(result: Any, batch: Any, *a: Any, **k: Any) -> None:
    plan = getattr(batch.tree_cache, "plan_captures", None)
    setattr(batch, ATTR, plan(batch.reqs) if callable(plan) else None)


def after_init_new(result: Any, cls: Any, batch: Any, *a: Any, **k: Any) -> None:
    setattr(result, ATTR, getattr(batch, ATTR, None))
    setattr(batch, ATTR, None)  # one forward per batch build: never carried to a decode


def after_load_batch(result: Any, runner: Any, forward_batch: Any, *a: Any, **k: Any) -> None:
    """The runners copy the forward batch into their static buffers: carry ours along."""
    if result is not forward_batch and isinstance(result, type(forward_batch)):
        setattr(result, ATTR, getattr(forward_batch, ATTR, None))


def batch_of(forward_batch: Any) -> BatchCaptures | None:
    """The captures a forward batch carries, if any."""
    batch: BatchCaptures | None = getattr(forward_batch, ATTR, None)
    return batch if batch is not None and batch.captures else None


def state_layers(backend: Any) -> int:
    """How many state layers the model has (the Mamba pool stacks one tensor per layer)."""
    return int(backend.req_to_token_pool.mamba_pool.mamba_cache.temporal.shape[0])


def register(registry: Any, hook_type: Any) -> None:
    """Register the scheduler-side hooks (called by the plugin's `register`)."""
    registry.register(f"{BATCH}.prepare_for_extend", after_prepare_for_extend, hook_type.AFTER)
    registry.register(f"{FORWARD_BATCH}.init_new", after_init_new, hook_type.AFTER)
    for runner in RUNNERS:
        registry.register(f"{runner}.load_batch", after_load_batch, hook_type.AFTER)
