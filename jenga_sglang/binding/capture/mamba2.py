"""In-pass captures inside SGLang's Mamba2 mixer (`MambaMixer2`; binding/capture/forward.py).

* AFTER `Mamba2AttnBackend.init_forward_metadata`: once per forward, the batch's captures
  become device index tensors on the metadata (capture/geometry.py `plan_mamba2`);
* AROUND `MambaMixer2.forward`: the layer's Mamba cache is the capture target meanwhile, and
  captures at a row's extend end are copied from its live slot when it returns (no kernel);
* AROUND the mixer's `causal_conv1d_fn` (both bindings): the conv states, before the conv
  overwrites the live slots;
* AROUND the scan's `_mamba_chunk_scan_combined_fwd` (inside SGLang's
  `mamba_chunk_scan_combined`): after the scan, every SSM state in one launch from the scan's
  own chunk-boundary states, processed `dt` and decay cumsum (its results 1-3), or from the
  row's start state (kernels/ssd_capture.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from jenga_sglang.binding.capture import forward as cf
from jenga_sglang.binding.capture.geometry import plan_mamba2
from jenga_sglang.kernels.ssd_capture import SsdCaptures, capture_ssd_states

BACKEND = "sglang.srt.layers.attention.hybrid_linear_attn_backend.Mamba2AttnBackend"
MIXER_MODULE = "sglang.srt.layers.attention.mamba.mamba"
SCAN_FWD = "sglang.kernels.ops.mamba.triton_ops.ssd_combined._mamba_chunk_scan_combined_fwd"


def after_init_forward_metadata(result: Any, backend: Any, forward_batch: Any) -> None:
    metadata = backend.forward_metadata
    setattr(metadata, cf.ATTR, None)
    batch = cf.batch_of(forward_batch)
    if batch is None or metadata.mixed_metadata is None:
        return
    extend_lens = [int(v) for v in forward_batch.extend_seq_lens_cpu]
    inner, tail = cf.split_tail(batch.captures, extend_lens)
    geometry = plan_mamba2(
        inner,
        [int(v) for v in forward_batch.extend_prefix_lens_cpu],
        extend_lens,
        int(metadata.mixed_metadata.chunk_size),
        int(backend.req_to_token_pool.mamba_pool.mamba_cache.temporal.shape[1]),
    ) if inner else None  # fmt: skip
    live = metadata.mamba_cache_indices[: metadata.num_prefills]

    def ssm_of(dst: Any) -> SsdCaptures:
        assert geometry is not None
        return SsdCaptures.of(
            geometry.chunk_src, geometry.row_src, geometry.ssm_start, geometry.ssm_count,
            geometry.ssm_chains, dst,
        )  # fmt: skip

    translate = backend._translate_mamba_indices
    layers = cf.state_layers(backend)
    captures = cf.build(batch, geometry, tail, live, translate, layers, ssm_of)
    setattr(metadata, cf.ATTR, captures)


def around_mixer_forward(original: Callable[..., Any], mixer: Any, *a: Any, **k: Any) -> Any:
    with cf.layer_scope(getattr(k.get("metadata"), cf.ATTR, None), k.get("layer_cache")):
        return original(mixer, *a, **k)


def around_conv(original: Callable[..., Any], x: Any, *a: Any, **k: Any) -> Any:
    layer = cf.current()
    if layer is not None:
        cf.gather_conv(layer, x.transpose(0, 1))
    return original(x, *a, **k)


_SCAN_PARAMS: dict[Callable[..., Any], inspect.Signature] = {}


def around_scan_fwd(original: Callable[..., Any], *a: Any, **k: Any) -> Any:
    result = original(*a, **k)
    layer = cf.current()
    if layer is None:
        return result
    sig = _SCAN_PARAMS.setdefault(original, inspect.signature(original))
    args = sig.bind(*a, **k).arguments
    _, dt, cumsum, chunk_states = result[:4]
    initial = args.get("initial_states")
    if initial is None and layer.captures.reads_row_states:
        raise RuntimeError("jenga in-pass capture: a row's start state was not passed to the scan")
    assert isinstance(layer.captures.ssm, SsdCaptures)
    capture_ssd_states(
        chunk_states[0], initial, layer.cache.temporal, args["x"][0], args["B"][0],
        dt[0], cumsum[0], layer.captures.ssm, checked=True,
    )  # fmt: skip
    cf.layer_written(layer)
    return result


def register(registry: Any, hook_type: Any) -> None:
    """Register the hooks above (called by the plugin's `register`)."""
    registry.register(
        f"{BACKEND}.init_forward_metadata", after_init_forward_metadata, hook_type.AFTER
    )
    registry.register(f"{MIXER_MODULE}.MambaMixer2.forward", around_mixer_forward, hook_type.AROUND)
    registry.register(f"{MIXER_MODULE}.causal_conv1d_fn", around_conv, hook_type.AROUND)
    registry.register(f"{MIXER_MODULE}.causal_conv1d_fn_triton", around_conv, hook_type.AROUND)
    registry.register(SCAN_FWD, around_scan_fwd, hook_type.AROUND)
