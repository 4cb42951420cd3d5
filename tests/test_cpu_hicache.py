"""The CPU test shim for stock HiCache (jenga_sglang/cpu_hicache.py): its torch copies move
the bytes SGLang's direct IO ops move, on the host pools' real layouts."""

from __future__ import annotations

import pytest
import torch

from jenga_sglang import cpu_hicache


def _device_layers(layers: int, tokens: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(tokens, 2, 3, generator=g) for _ in range(layers)]


@pytest.mark.parametrize("page_size", [1, 4])
def test_all_layer_write_then_per_layer_load_restores_the_rows(page_size: int) -> None:
    """Device layer-first K and V (`[token, head, dim]` per layer) written to host page-first
    buffers (`[page, layer, page_size, head, dim]`, MHA's page_first_direct) and loaded back
    layer by layer into other device slots give the same rows; nothing else moves."""
    layers, tokens, pages = 3, 16, 6
    k, v = _device_layers(layers, tokens, 1), _device_layers(layers, tokens, 2)
    host_k = torch.zeros(pages, layers, page_size, 2, 3)
    host_v = torch.zeros_like(host_k)
    device = torch.tensor([4, 5, 6, 7]) if page_size == 4 else torch.tensor([3, 9, 11])
    host = torch.tensor([8, 9, 10, 11]) if page_size == 4 else torch.tensor([1, 4, 2])
    cpu_hicache.transfer_kv_all_layer_direct_lf_pf(
        src_ptrs=[*k, *v], dst_ptrs=[host_k, host_v], src_indices=device, dst_indices=host,
        page_size=page_size,
    )  # fmt: skip
    for layer in range(layers):
        for i, (d, h) in enumerate(zip(device.tolist(), host.tolist(), strict=True)):
            where = (h // page_size, layer, h % page_size)
            assert torch.equal(host_k[where], k[layer][d]), (layer, i)
            assert torch.equal(host_v[where], v[layer][d]), (layer, i)
    written = int((host_k != 0).flatten(0, 2).any(-1).any(-1).sum())
    assert written == layers * len(host)  # only the named rows
    back = torch.tensor([0, 1, 2, 12][: len(host)])
    for layer in range(layers):
        dk, dv = torch.zeros(tokens, 2, 3), torch.zeros(tokens, 2, 3)
        cpu_hicache.transfer_kv_per_layer_direct_pf_lf(
            src_ptrs=[host_k, host_v], dst_ptrs=[dk, dv], src_indices=host, dst_indices=back,
            layer_id=layer, page_size=page_size,
        )  # fmt: skip
        assert torch.equal(dk[back], k[layer][device])
        assert torch.equal(dv[back], v[layer][device])
        assert not dk[[i for i in range(tokens) if i not in back.tolist()]].any()


def test_mamba_state_round_trip_on_the_page_first_state_layout() -> None:
    """A Mamba host buffer is `[slot, layer, 1, *state]` (no page axis beyond 1): every
    layer's state of the named slots goes to host and comes back to other slots."""
    layers = 2
    states = [torch.randn(10, 4, 5) for _ in range(layers)]
    host = torch.zeros(7, layers, 1, 4, 5)
    src, dst = torch.tensor([2, 8]), torch.tensor([6, 0])
    cpu_hicache.transfer_kv_all_layer_direct_lf_pf(
        src_ptrs=states, dst_ptrs=[host], src_indices=src, dst_indices=dst, page_size=1
    )
    for layer in range(layers):
        out = torch.zeros(10, 4, 5)
        cpu_hicache.transfer_kv_per_layer_direct_pf_lf(
            src_ptrs=[host], dst_ptrs=[out], src_indices=dst, dst_indices=torch.tensor([1, 3]),
            layer_id=layer, page_size=1,
        )  # fmt: skip
        assert torch.equal(out[[1, 3]], states[layer][src])


def test_layer_first_direct_copy_and_a_bad_split() -> None:
    """`transfer_kv_direct` copies rows by index per layer pair; device layers that do not
    split evenly over the host buffers are refused, naming both counts."""
    src, dst = _device_layers(2, 8, 3), [torch.zeros(8, 2, 3) for _ in range(2)]
    cpu_hicache.transfer_kv_direct(
        src_layers=src, dst_layers=dst, src_indices=torch.tensor([1, 5]),
        dst_indices=torch.tensor([0, 7]), page_size=1,
    )  # fmt: skip
    for s, d in zip(src, dst, strict=True):
        assert torch.equal(d[[0, 7]], s[[1, 5]]) and not d[1:7].any()
    with pytest.raises(ValueError, match="3 device layers do not split over 2"):
        cpu_hicache.transfer_kv_all_layer_direct_lf_pf(
            src_ptrs=src + src[:1], dst_ptrs=dst, src_indices=torch.tensor([0]),
            dst_indices=torch.tensor([0]), page_size=1,
        )  # fmt: skip


def test_install_binds_the_copies_where_sglangs_host_pools_call_them() -> None:
    """SGLang's host-pool modules call the copies by their module-level names, which they bind
    only on CUDA or ROCm; `install` binds ours there and turns the pinning off."""
    import importlib

    from sglang.srt.mem_cache.pool_host import common

    cpu_hicache.install()
    for name, copies in cpu_hicache.MODULES.items():
        module = importlib.import_module(name)
        for copy in copies:
            assert getattr(module, copy) is getattr(cpu_hicache, copy)
    assert common._cuda_host_register is cpu_hicache._no_pinning
