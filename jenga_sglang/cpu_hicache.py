"""CPU-only test shim: stock SGLang's hierarchical cache (`--enable-hierarchical-cache`) live.

SGLang 0.5.23's HiCache cannot start on a machine without a GPU: the host pools pin their
memory through CUDA (`pool_host/common.py` `_cuda_host_register`), and the byte copies between
the device pools and the host pools are sgl_kernel's CUDA ops (`sgl_kernel.kvcacheio`), which
the host-pool modules import only on CUDA or ROCm. Everything else of it (the tree, the host
allocator, the cache controller's write and load queues and their acknowledgements, the
layer-done counter) is plain torch and Python and runs here.

This module exists so that our benchmarks can run stock HiCache as a live baseline beside our
host tier on CPU, not for serving. In the plugin's CPU interpreter mode only (no CUDA and
``TRITON_INTERPRET=1``; jenga_sglang/cpu_interpreter.py) it

* skips the pinning (there is no device to pin for), and
* gives the host-pool modules torch versions of the three copies of the ``direct`` IO backend
  (`--hicache-io-backend direct`), with the layouts those pools use
  (`--hicache-mem-layout page_first_direct`; SGLang's Mamba host pool takes page-first only):
  `transfer_kv_direct` (layer-first on both sides), `transfer_kv_per_layer_direct_pf_lf` (one
  layer, host page-first to device layer-first) and `transfer_kv_all_layer_direct_lf_pf`
  (every layer, device to host). They move the same bytes the CUDA ops move, so a load-back
  restores what was written and the server's outputs can be compared with stock's.

The ``kernel`` IO backend (SGLang's default) stays unavailable on CPU: a server started with it
fails as it does without this shim. On a GPU machine nothing is changed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

logger = logging.getLogger(__name__)

#: The host-pool modules that bind the copies at import, and the copies each one uses.
MODULES = {
    "sglang.srt.mem_cache.pool_host.mha": (
        "transfer_kv_direct",
        "transfer_kv_per_layer_direct_pf_lf",
        "transfer_kv_all_layer_direct_lf_pf",
    ),
    "sglang.srt.mem_cache.pool_host.mamba": (
        "transfer_kv_direct",
        "transfer_kv_per_layer_direct_pf_lf",
        "transfer_kv_all_layer_direct_lf_pf",
    ),
}


def transfer_kv_direct(
    src_layers: Sequence[torch.Tensor],
    dst_layers: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Row `src_indices[i]` of each source layer to row `dst_indices[i]` of its destination
    (token rows; `page_size` only groups them on the GPU)."""
    del page_size
    for src, dst in zip(src_layers, dst_layers, strict=True):
        _put(dst, (_index(dst_indices, dst),), src[_index(src_indices, src)])


def transfer_kv_per_layer_direct_pf_lf(
    src_ptrs: Sequence[torch.Tensor],
    dst_ptrs: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: int,
    page_size: int,
) -> None:
    """Layer `layer_id` of host page-first buffers (`[page, layer, (page_size,) ...]`) into the
    device's layer tensors (`[token, ...]`)."""
    for src, dst in zip(src_ptrs, dst_ptrs, strict=True):
        rows = src[_host_rows(_index(src_indices, src), layer_id, page_size)]
        _put(dst, (_index(dst_indices, dst),), rows)


def transfer_kv_all_layer_direct_lf_pf(
    src_ptrs: Sequence[torch.Tensor],
    dst_ptrs: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Every device layer tensor into the host page-first buffers: `src_ptrs` holds each host
    buffer's layers in order (K's layers, then V's), so buffer `b` takes layers
    `src_ptrs[b * L : (b + 1) * L]`."""
    if not dst_ptrs or len(src_ptrs) % len(dst_ptrs):
        raise ValueError(f"{len(src_ptrs)} device layers do not split over {len(dst_ptrs)} buffers")
    layers = len(src_ptrs) // len(dst_ptrs)
    for b, dst in enumerate(dst_ptrs):
        host = _index(dst_indices, dst)
        for layer in range(layers):
            src = src_ptrs[b * layers + layer]
            _put(dst, _host_rows(host, layer, page_size), src[_index(src_indices, src)])


def _index(indices: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """`indices` as int64 on `tensor`'s device, for advanced indexing."""
    return indices.to(tensor.device, torch.int64)


def _put(dst: torch.Tensor, where: tuple[torch.Tensor, ...], rows: torch.Tensor) -> None:
    """`dst[where] = rows`, with `rows` shaped as that selection (one row per index, then the
    axes `where` leaves: a host row of one token a page and a device row differ only by a
    unit axis) and moved to `dst`'s device and dtype."""
    shape = (len(where[0]), *dst.shape[len(where) :])
    dst[where] = rows.reshape(shape).to(dst.device, dst.dtype)


def _host_rows(tokens: torch.Tensor, layer: int, page_size: int) -> tuple[torch.Tensor, ...]:
    """Index of `tokens`' rows of `layer` in a page-first host buffer: `[token, layer]` at one
    token a page (the Mamba host pool has no page axis), else `[page, layer, offset]`."""
    if page_size == 1:
        return (tokens, torch.full_like(tokens, layer))
    return (tokens // page_size, torch.full_like(tokens, layer), tokens % page_size)


def _no_pinning(*_: object, **__: object) -> None:
    """CUDA host registration: nothing to pin without a GPU."""


def install() -> None:
    """Put the copies into the host-pool modules and skip the pinning; idempotent."""
    import importlib

    from sglang.srt.mem_cache.pool_host import common

    common._cuda_host_register = _no_pinning
    for name, copies in MODULES.items():
        module = importlib.import_module(name)
        for copy in copies:
            setattr(module, copy, globals()[copy])


def register_hooks() -> bool:
    """Install in the CPU interpreter mode only; True when installed."""
    from jenga_sglang.cpu_interpreter import sglang_needs_cpu_patches

    if not sglang_needs_cpu_patches():
        return False
    install()
    logger.info("jenga CPU test shim: HiCache host pools unpinned, direct copies in torch")
    return True
