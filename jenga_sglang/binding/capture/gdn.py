"""In-pass captures inside SGLang's Gated DeltaNet prefill (Qwen3-Next, Qwen3.5, Qwen3.5-MoE;
binding/capture/forward.py).

* AFTER `GDNAttnBackend.init_forward_metadata`: once per extend forward, the batch's captures
  become device index tensors on the metadata (capture/geometry.py `plan_gdn`); not for
  speculative verification or multi-item scoring, whose layers take other kernels;
* AROUND `GDNAttnBackend.forward_extend`: the layer's Mamba cache is the capture target
  meanwhile, and captures at a row's extend end are copied from its live slot when it returns
  (no kernel; SGLang's page-major path has scattered its contiguous copies back by then);
* AROUND `GDNAttnBackend._convolve_prefill`: the conv states, gathered into the pool before the
  conv overwrites the live slots. The conv may run on contiguous copies of the live slots
  (SGLang's page-major path); the pool still holds the same values then, and captures go to
  the pool's own slots;
* AROUND FLA's `chunk_gated_delta_rule_fwd_h` (SGLang's Triton prefill kernel): after it, every
  state in one launch from the chunk states `h` and delta values `v_new` it returns
  (kernels/gdn_capture.py).

Another prefill kernel (FlashInfer's, `--linear-attn-prefill-backend`) never reaches the last
hook: the batch is then not served and its slots are freed unwritten (counted lost).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from jenga_sglang.binding.capture import forward as cf
from jenga_sglang.binding.capture.geometry import plan_gdn
from jenga_sglang.kernels.gdn_capture import GdnCaptures, capture_gdn_states

BACKEND = "sglang.srt.layers.attention.linear.gdn_backend.GDNAttnBackend"
CHUNK_H = "sglang.kernels.ops.attention.fla.chunk.chunk_gated_delta_rule_fwd_h"


def after_init_forward_metadata(result: Any, backend: Any, forward_batch: Any) -> None:
    metadata = backend.forward_metadata
    setattr(metadata, cf.ATTR, None)
    batch = cf.batch_of(forward_batch)
    mode = forward_batch.forward_mode
    if batch is None or not mode.is_extend() or mode.is_target_verify():
        return
    if getattr(backend, "mis_metadata", None) is not None:
        return
    extend_lens = [int(v) for v in forward_batch.extend_seq_lens_cpu]
    inner, tail = cf.split_tail(batch.captures, extend_lens)
    geometry = plan_gdn(
        inner,
        [int(v) for v in forward_batch.extend_prefix_lens_cpu],
        extend_lens,
        int(backend.req_to_token_pool.mamba_pool.mamba_cache.temporal.shape[1]),
    ) if inner else None  # fmt: skip
    live = metadata.mamba_cache_indices[: len(extend_lens)]

    def ssm_of(dst: Any) -> GdnCaptures:
        assert geometry is not None
        src, start, count = (
            cf.device_ids(v, live.device)
            for v in (geometry.chunk_src, geometry.ssm_start, geometry.ssm_count)
        )
        return GdnCaptures(src, dst, start, count)

    translate = backend._translate_mamba_indices
    layers = cf.state_layers(backend)
    captures = cf.build(batch, geometry, tail, live, translate, layers, ssm_of)
    setattr(metadata, cf.ATTR, captures)


def around_forward_extend(
    original: Callable[..., Any], backend: Any, layer: Any, forward_batch: Any, *a: Any, **k: Any
) -> Any:
    captures = getattr(backend.forward_metadata, cf.ATTR, None)
    if captures is None or forward_batch.forward_mode.is_target_verify():
        return original(backend, layer, forward_batch, *a, **k)
    cache = backend.req_to_token_pool.mamba2_layer_cache(layer.layer_id)
    with cf.layer_scope(captures, cache):
        return original(backend, layer, forward_batch, *a, **k)


def around_convolve_prefill(
    original: Callable[..., Any], backend: Any, layer: Any, forward_batch: Any,
    mixed_qkv: Any, *a: Any, **k: Any,
) -> Any:  # fmt: skip
    running = cf.current()
    if running is not None:
        cf.gather_conv(running, mixed_qkv)
    return original(backend, layer, forward_batch, mixed_qkv, *a, **k)


_CHUNK_H_PARAMS: dict[Callable[..., Any], inspect.Signature] = {}


def around_chunk_h(original: Callable[..., Any], *a: Any, **k: Any) -> Any:
    h, v_new = original(*a, **k)
    layer = cf.current()
    if layer is None:
        return h, v_new
    sig = _CHUNK_H_PARAMS.setdefault(original, inspect.signature(original))
    args = sig.bind(*a, **k).arguments
    assert isinstance(layer.captures.ssm, GdnCaptures)
    capture_gdn_states(
        h[0], layer.cache.temporal, args["k"][0], v_new[0], args["g"][0], layer.captures.ssm,
        checked=True,
    )  # fmt: skip
    cf.layer_written(layer)
    return h, v_new


def register(registry: Any, hook_type: Any) -> None:
    """Register the hooks above (called by the plugin's `register`)."""
    registry.register(
        f"{BACKEND}.init_forward_metadata", after_init_forward_metadata, hook_type.AFTER
    )
    registry.register(f"{BACKEND}.forward_extend", around_forward_extend, hook_type.AROUND)
    registry.register(f"{BACKEND}._convolve_prefill", around_convolve_prefill, hook_type.AROUND)
    registry.register(CHUNK_H, around_chunk_h, hook_type.AROUND)
