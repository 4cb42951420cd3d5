"""A draft model's KV in the target's KV pages (binding/pools/draft.py), on device="cpu".

The target's pool keeps the draft's layers in the same rows as its own, so a token slot the
allocator hands out holds both; the draft worker's `_init_pools` gets SGLang's pool class over
those views, and what cannot be held that way is refused naming the reason. The host tier's
copies move the draft's layers with the target's.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.sglang

ATTN = (0, 2)
MAMBA = (1, 3)
DRAFT_LAYERS = 3


@pytest.fixture(scope="module")
def torch() -> Any:
    import torch as torch_module
    from sglang.test.unified_allocator_fixtures import setup_allocator_context

    setup_allocator_context()
    return torch_module


@pytest.fixture(autouse=True)
def draft_backend(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The draft worker's attention backend as SGLang would resolve it: triton (the served
    one) unless a test changes it (this context has none configured)."""
    from sglang.srt.speculative import draft_worker_common

    chosen = ["triton"]
    monkeypatch.setattr(
        draft_worker_common, "resolve_draft_worker_attention_backend", lambda: chosen[0]
    )
    return chosen


def _cache_params(torch: Any) -> Any:
    """SGLang's Mamba2 cache parameters of two layers (conv (3, 8) bf16, temporal (1, 4, 8))."""
    return SimpleNamespace(
        shape=SimpleNamespace(conv=[(3, 8)], temporal=(1, 4, 8)),
        dtype=SimpleNamespace(conv=torch.bfloat16, temporal=torch.float32),
        layers=list(MAMBA),
    )


def _pools(torch: Any, draft_layers: int = DRAFT_LAYERS) -> Any:
    from jenga_sglang.binding.pools.build import (
        KVShape,
        build_jenga_pools,
        static_split_bytes,
        storage_spec,
    )

    kv = KVShape(ATTN, 2, 8, torch.bfloat16, draft_layers=draft_layers)
    params = _cache_params(torch)
    rows = {"size": 4, "max_context_len": 128, "enable_mamba_extra_buffer": False}
    return build_jenga_pools(
        kv=kv,
        cache_params=params,
        mamba_layer_ids=MAMBA,
        budget_bytes=static_split_bytes(storage_spec(kv, params), 64, 6),
        state_reserve=2,
        device="cpu",
        req_pool_kwargs={**rows, "speculative_num_draft_tokens": 4, "mamba_spec_state_size": 4},
    )


def _draft_worker(layers: int = DRAFT_LAYERS, heads: int = 2, **overrides: Any) -> Any:
    fields = {
        "model_config": SimpleNamespace(get_num_kv_heads=lambda tp, dcp: heads, head_dim=8),
        "is_draft_worker": True,
        "mambaish_config": None,
        "is_hybrid_swa": False,
        "is_hybrid_swa_mtp_draft": False,
        "device": "cpu",
        "layer_info": SimpleNamespace(start_layer=0, end_layer=layers, num_effective_layers=layers),
    }
    return SimpleNamespace(**(fields | overrides))


def _layer(layer_id: int) -> Any:
    return SimpleNamespace(layer_id=layer_id)


def test_the_draft_writes_its_kv_into_the_rows_of_the_targets_slots(torch: Any) -> None:
    """One row per token: the target's K and V of each layer, then the draft's; a write
    through either pool is that row's bytes, and neither touches the other's layers."""
    from jenga_sglang.binding.pools.build import KV_TYPE
    from jenga_sglang.binding.pools.draft import draft_kv_pool

    pools = _pools(torch)
    layout, allocator = pools.layout, pools.token_to_kv_pool_allocator
    draft = draft_kv_pool(_draft_worker(), allocator)
    assert layout.geometry.of(KV_TYPE).page_bytes == (2 + DRAFT_LAYERS) * 2 * 32  # K+V, 32 B each
    loc = allocator.alloc(4)
    target_k, draft_k = torch.randn(4, 2, 8).bfloat16(), torch.randn(4, 2, 8).bfloat16()
    pools.token_to_kv_pool.set_kv_buffer(_layer(2), loc, target_k, target_k * 2)
    draft.set_kv_buffer(_layer(1), loc, draft_k, draft_k * 2)  # SGLang's write, draft layer 1
    assert torch.equal(draft.get_key_buffer(1)[loc], draft_k)
    assert torch.equal(pools.token_to_kv_pool.get_key_buffer(2)[loc], target_k)
    assert not draft.get_key_buffer(0)[loc].any() and not draft.get_key_buffer(2)[loc].any()
    raw = layout.page_bytes(KV_TYPE, int(loc[0]) - 1)  # [K0 V0 K1 V1 | dK0 dV0 dK1 dV1 dK2 dV2]
    assert torch.equal(raw[2 * 32 : 3 * 32].view(torch.bfloat16).view(2, 8), target_k[0])
    assert torch.equal(raw[6 * 32 : 7 * 32].view(torch.bfloat16).view(2, 8), draft_k[0])
    assert torch.equal(raw[7 * 32 : 8 * 32].view(torch.bfloat16).view(2, 8), draft_k[0] * 2)
    start = layout.buffer.data_ptr()
    for buf in (*draft.k_buffer, *draft.v_buffer):
        assert start <= buf.data_ptr() < start + layout.buffer.numel()
        assert buf.stride(0) * 2 == layout.geometry.of(KV_TYPE).page_bytes  # bf16 elements
    assert draft.size == pools.token_to_kv_pool.full_kv_pool.size  # every slot the target has


def test_the_budget_and_the_host_copies_count_the_drafts_layers(torch: Any) -> None:
    """SGLang charges a draft's layers per KV token: so do the storage spec and the budget;
    the host tier's copies move the draft's layers of a row with the target's."""
    from jenga_sglang.binding.host.copies import kv_buffers
    from jenga_sglang.binding.pools.build import KV_TYPE, KVShape, storage_spec

    params = _cache_params(torch)
    plain = storage_spec(KVShape(ATTN, 2, 8, torch.bfloat16), params)
    fused = storage_spec(KVShape(ATTN, 2, 8, torch.bfloat16, draft_layers=3), params)
    assert fused.kv_bytes_per_token == plain.kv_bytes_per_token * 5 // 2
    assert fused.state_bytes == plain.state_bytes
    pools = _pools(torch)
    assert kv_buffers(pools.token_to_kv_pool, KV_TYPE, None)[KV_TYPE] == [
        *pools.token_to_kv_pool.full_kv_pool.k_buffer,
        *pools.token_to_kv_pool.full_kv_pool.v_buffer,
    ]  # no draft worker built over it yet
    draft = _built_draft_worker(pools).token_to_kv_pool
    with_draft = kv_buffers(pools.token_to_kv_pool, KV_TYPE, None)[KV_TYPE]
    without = kv_buffers(_pools(torch, 0).token_to_kv_pool, KV_TYPE, None)[KV_TYPE]
    assert (len(with_draft), len(without)) == (2 * (2 + DRAFT_LAYERS), 2 * 2)
    assert with_draft[4:] == [*draft.k_buffer, *draft.v_buffer]  # the worker's row views


def _built_draft_worker(pools: Any) -> Any:
    """The draft worker's pools as our hook builds them over the target's `pools`."""
    from jenga_sglang.binding.pools.hook import around_init_pools

    def original(configurator: Any, **kwargs: Any) -> str:
        return "sglang's pools"

    return around_init_pools(
        original,
        _draft_worker(),
        sizes=None,
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool_allocator=pools.token_to_kv_pool_allocator,
    )


def test_the_hook_gives_a_draft_worker_the_views_and_sglang_the_rest(torch: Any) -> None:
    from jenga_sglang.binding.pools.sglang_pool import JengaMHATokenToKVPool

    pools = _pools(torch)
    got = _built_draft_worker(pools)
    assert got.req_to_token_pool is pools.req_to_token_pool
    assert got.token_to_kv_pool_allocator is pools.token_to_kv_pool_allocator
    assert isinstance(got.token_to_kv_pool, JengaMHATokenToKVPool)
    found = pools.token_to_kv_pool.jenga_draft_kv
    assert got.token_to_kv_pool.k_buffer[2] is found.k_views[2]


def test_a_draft_on_sglangs_pools_has_its_kv_copied_to_host_with_the_targets(
    torch: Any,
) -> None:
    """--no-jenga-pool: SGLang builds the draft worker's pools, and the host tier's copies
    take the draft's K and V at the target's slots with the target's; a draft pool over other
    slots is refused where the tier is built, not copied wrong."""
    from jenga_sglang.binding.host.copies import kv_buffers
    from jenga_sglang.binding.pools.build import KV_TYPE
    from jenga_sglang.binding.pools.hook import around_init_pools

    def kv(slots: int, layers: int) -> Any:
        return SimpleNamespace(
            k_buffer=[torch.zeros(slots, 2, 8) for _ in range(layers)],
            v_buffer=[torch.zeros(slots, 2, 8) for _ in range(layers)],
        )

    class HybridKV:  # SGLang's hybrid pool around its full-attention KV (weakly referenced)
        full_kv_pool = kv(64, 2)

    def draft_worker_pools(target: Any, draft: Any) -> Any:
        return around_init_pools(
            lambda configurator, **kwargs: SimpleNamespace(token_to_kv_pool=draft),
            _draft_worker(server_args=SimpleNamespace()),
            sizes=None,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=lambda: target),
        )

    target, draft = HybridKV(), kv(64, 1)
    assert draft_worker_pools(target, draft).token_to_kv_pool is draft  # SGLang's to build
    copied = kv_buffers(target, KV_TYPE, None)[KV_TYPE]
    assert len(copied) == 2 * (2 + 1)
    assert copied[4] is draft.k_buffer[0] and copied[5] is draft.v_buffer[0]  # after K0 K1 V0 V1
    assert len(kv_buffers(HybridKV(), KV_TYPE, None)[KV_TYPE]) == 2 * 2  # no draft
    draft_worker_pools(target, kv(32, 1))
    with pytest.raises(NotImplementedError, match="over the target's 64 token slots"):
        kv_buffers(target, KV_TYPE, None)


@pytest.mark.parametrize(
    ("draft_layers", "worker", "named"),
    [
        (DRAFT_LAYERS, {"mambaish_config": object()}, "Mamba or linear-attention layers"),
        (DRAFT_LAYERS, {"is_hybrid_swa": True}, "sliding-window layers"),
        (DRAFT_LAYERS, {"layers": 2}, "2 KV layers .3 laid out for it"),
        (DRAFT_LAYERS, {"heads": 4}, r"KV heads x head dim \(4, 8\) on this rank \(\(2, 8\)"),
        (0, {}, "3 KV layers .0 laid out for it"),
    ],
)
def test_a_draft_the_rows_do_not_hold_is_refused_naming_why(
    torch: Any, draft_layers: int, worker: dict[str, Any], named: str
) -> None:
    from jenga_sglang.binding.pools.build import PoolBuildError
    from jenga_sglang.binding.pools.draft import draft_kv_pool

    allocator = _pools(torch, draft_layers).token_to_kv_pool_allocator
    layers, heads = worker.pop("layers", DRAFT_LAYERS), worker.pop("heads", 2)
    with pytest.raises(PoolBuildError, match=f"{named}.*--no-jenga-pool"):
        draft_kv_pool(_draft_worker(layers, heads, **worker), allocator)


def _target(
    algorithm: str | None, heads: int = 2, head_dim: int = 8, layers: int | None = 3
) -> Any:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    draft = SimpleNamespace(
        get_num_kv_heads=lambda tp, dcp: heads, head_dim=head_dim, v_head_dim=head_dim
    )
    aux = SimpleNamespace(eagle_draft_num_layers=layers, draft_model_config=draft)
    return SimpleNamespace(
        spec_algorithm=SpeculativeAlgorithm.from_string(algorithm), spec_aux_config=aux
    )


def test_the_target_lays_out_a_draft_of_its_kv_shape_and_refuses_another(torch: Any) -> None:
    from jenga_sglang.binding.pools.build import KVShape, PoolBuildError
    from jenga_sglang.binding.pools.draft import draft_layers

    kv = KVShape(ATTN, 2, 8, torch.bfloat16)
    assert draft_layers(_target("STANDALONE"), kv) == 3
    assert draft_layers(_target("NGRAM"), kv) == 0  # no draft model
    assert draft_layers(_target(None, layers=None), kv) == 0  # no speculation
    assert draft_layers(SimpleNamespace(spec_algorithm=_target("NGRAM").spec_algorithm), kv) == 0
    with pytest.raises(
        PoolBuildError, match=r"target.s KV heads and head dim \(2 x 8\); the draft has 4 x 8"
    ):
        draft_layers(_target("STANDALONE", heads=4), kv)
    with pytest.raises(PoolBuildError, match="no draft layer count"):
        draft_layers(_target("STANDALONE", layers=None), kv)
