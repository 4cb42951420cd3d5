"""In-pass SSM checkpoints: SGLang's Mamba2 prefill writes our captures as it runs.

Hooks (registered through SGLang's HookRegistry by the plugin; no SGLang file is edited):

* AFTER `ScheduleBatch.prepare_for_extend`: the batch's planned positions get destination
  slots (binding/captures.py, through the backend); the batch carries them as `jenga_captures`;
* AFTER `ForwardBatch.init_new` and the runners' `load_batch` (which copy the forward batch
  into static buffers): the forward batch carries the same object;
* AFTER `Mamba2AttnBackend.init_forward_metadata`: once per forward, the index lists of every
  capture (binding/capture_geometry.py), checked on the host, become device tensors on the
  layers' metadata, and the batch is marked served;
* AROUND `MambaMixer2.forward`: the layer's Mamba cache is the capture target of the two
  kernel hooks below while it runs (a context variable, so nothing else is touched);
* AROUND the mixer's `causal_conv1d_fn` (both bindings): before the conv overwrites the live
  slots, the conv state at every capture is gathered from the packed conv inputs and the
  rows' initial conv states (kernels/conv_gather.py);
* AROUND the scan's `_mamba_chunk_scan_combined_fwd` (inside SGLang's
  `mamba_chunk_scan_combined`): after the scan, every SSM state is computed in one launch from
  the scan's own chunk-boundary states, processed `dt` and decay cumsum, or from the row's start
  state (kernels/ssd_capture.py).

Per Mamba layer that is two launches, touching only the <= chunk tokens before each capture;
no extra forward, no chunk cut. Outside a capturing forward each hook is one context-variable
read.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from jenga_sglang.binding.capture_geometry import Geometry, plan_geometry
from jenga_sglang.binding.captures import BatchCaptures
from jenga_sglang.kernels.conv_gather import NO_INIT, gather_conv_states
from jenga_sglang.kernels.ssd_capture import SsdCaptures, capture_ssd_states

BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"
FORWARD_BATCH = "sglang.srt.model_executor.forward_batch_info.ForwardBatch"
BACKEND = "sglang.srt.layers.attention.hybrid_linear_attn_backend.Mamba2AttnBackend"
MIXER_MODULE = "sglang.srt.layers.attention.mamba.mamba"
SCAN_FWD = "sglang.kernels.ops.mamba.triton_ops.ssd_combined._mamba_chunk_scan_combined_fwd"
RUNNERS = (
    "sglang.srt.model_executor.runner.eager_runner.EagerRunner",
    "sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner",
)
ATTR = "jenga_captures"  # on ScheduleBatch / ForwardBatch / Mamba2Metadata


@dataclass(frozen=True)
class ForwardCaptures:
    """Device-side index tensors of one forward's captures (built once, read by every layer)."""

    dst: torch.Tensor
    conv_start: torch.Tensor
    conv_count: torch.Tensor
    conv_init: torch.Tensor  # live slot holding older conv inputs, or NO_INIT
    ssm: SsdCaptures  # dst: physical slots
    reads_row_states: bool


@dataclass
class _Layer:
    captures: ForwardCaptures
    cache: Any  # MambaPool.State of the running layer
    conv_done: bool = False


_LAYER: contextvars.ContextVar[_Layer | None] = contextvars.ContextVar("jenga_layer", default=None)


def _ids(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)


def build(
    geometry: Geometry, live_slots: torch.Tensor, translate: Callable[[torch.Tensor], torch.Tensor]
) -> ForwardCaptures:
    """Device tensors for `geometry`; `live_slots` are the rows' (physical) Mamba slots and
    `translate` maps SGLang slot ids to physical ones (identity but for a unified pool)."""
    device = live_slots.device
    rows = _ids(geometry.conv_init_row, device)
    init = torch.where(rows >= 0, live_slots[rows.clamp(min=0)].to(torch.int64), NO_INIT)
    dst = translate(_ids(geometry.dst, device)).to(torch.int64)
    ssm = SsdCaptures(
        chunk_src=_ids(geometry.chunk_src, device),
        row_src=_ids(geometry.row_src, device),
        dst=dst,
        start=_ids(geometry.ssm_start, device),
        count=_ids(geometry.ssm_count, device),
    )
    return ForwardCaptures(
        dst=dst,
        conv_start=_ids(geometry.conv_start, device),
        conv_count=_ids(geometry.conv_count, device),
        conv_init=init,
        ssm=ssm,
        reads_row_states=geometry.reads_row_states,
    )


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


# ---------------------------------------------------------------- model-side hooks


def after_init_forward_metadata(result: Any, backend: Any, forward_batch: Any) -> None:
    batch: BatchCaptures | None = getattr(forward_batch, ATTR, None)
    metadata = backend.forward_metadata
    setattr(metadata, ATTR, None)
    if batch is None or not batch.captures or metadata.mixed_metadata is None:
        return
    geometry = plan_geometry(
        batch.captures,
        [int(v) for v in forward_batch.extend_prefix_lens_cpu],
        [int(v) for v in forward_batch.extend_seq_lens_cpu],
        int(metadata.mixed_metadata.chunk_size),
        int(backend.req_to_token_pool.mamba_pool.mamba_cache.temporal.shape[1]),
    )
    live = metadata.mamba_cache_indices[: metadata.num_prefills]
    setattr(metadata, ATTR, build(geometry, live, backend._translate_mamba_indices))
    batch.served = True


def around_mixer_forward(original: Callable[..., Any], mixer: Any, *a: Any, **k: Any) -> Any:
    captures = getattr(k.get("metadata"), ATTR, None)
    if captures is None:
        return original(mixer, *a, **k)
    token = _LAYER.set(_Layer(captures, k["layer_cache"]))
    try:
        return original(mixer, *a, **k)
    finally:
        _LAYER.reset(token)


def around_conv(original: Callable[..., Any], x: Any, *a: Any, **k: Any) -> Any:
    layer = _LAYER.get()
    if layer is not None and not layer.conv_done:
        layer.conv_done = True  # both conv bindings may wrap one function: gather once
        c = layer.captures
        conv = k["conv_states"]
        gather_conv_states(
            x.transpose(0, 1), conv, c.dst, c.conv_start, c.conv_count, conv, c.conv_init,
            checked=True,
        )  # fmt: skip
    return original(x, *a, **k)


_SCAN_PARAMS: dict[Callable[..., Any], inspect.Signature] = {}


def around_scan_fwd(original: Callable[..., Any], *a: Any, **k: Any) -> Any:
    """After the scan, every capture's SSM state from the scan's own chunk states, processed
    dt and decay cumsum (its results 1-3), in one launch into the layer's temporal pool."""
    result = original(*a, **k)
    layer = _LAYER.get()
    if layer is None:
        return result
    sig = _SCAN_PARAMS.setdefault(original, inspect.signature(original))
    args = sig.bind(*a, **k).arguments
    _, dt, cumsum, chunk_states = result[:4]
    initial = args.get("initial_states")
    if initial is None and layer.captures.reads_row_states:
        raise RuntimeError("jenga in-pass capture: a row's start state was not passed to the scan")
    capture_ssd_states(
        chunk_states[0], initial, layer.cache.temporal, args["x"][0], args["B"][0],
        dt[0], cumsum[0], layer.captures.ssm, checked=True,
    )  # fmt: skip
    return result


def register(registry: Any, hook_type: Any) -> None:
    """Register every hook above (called by the plugin's `register`)."""
    registry.register(f"{BATCH}.prepare_for_extend", after_prepare_for_extend, hook_type.AFTER)
    registry.register(f"{FORWARD_BATCH}.init_new", after_init_new, hook_type.AFTER)
    for runner in RUNNERS:
        registry.register(f"{runner}.load_batch", after_load_batch, hook_type.AFTER)
    registry.register(
        f"{BACKEND}.init_forward_metadata", after_init_forward_metadata, hook_type.AFTER
    )
    registry.register(f"{MIXER_MODULE}.MambaMixer2.forward", around_mixer_forward, hook_type.AROUND)
    registry.register(f"{MIXER_MODULE}.causal_conv1d_fn", around_conv, hook_type.AROUND)
    registry.register(f"{MIXER_MODULE}.causal_conv1d_fn_triton", around_conv, hook_type.AROUND)
    registry.register(SCAN_FWD, around_scan_fwd, hook_type.AROUND)
