"""SGLang's Triton attention kernels, compiled, on the Jenga pool's KV views (GPU, no SGLang).

The check of tests/test_attention_views.py (there under Triton's CPU interpreter, on the views
the binding builds through SGLang's pool classes) on a CUDA GPU: for the Mamba-hybrid pool and
a gpt-oss-like sliding-window pool (window lists, window mask, attention sinks), pages of 1, 16
and 64 tokens and float32, bfloat16 and float16 KV, each of the extend, deterministic-extend and
decode kernels must give the same output on the pool's views as on contiguous copies, bit for
bit, and close to a float64 reference, while a view read with the contiguous row stride must
not. The views are pool/layout.py's slot views, built as binding/pools/build.py builds them (the
CPU test checks that SGLang's pools hand out exactly these).

Usage, from the repository root (SGLang is needed only for the first step, which copies its
kernels into the ignored build/; carry that folder to the GPU machine):
    scripts/sglang-attention-ops.sh build/sglang-attn
    PYTHONPATH=build/sglang-attn python scripts/gpu_attention_views.py
Exits 1 if any check fails; prints one line per (pool, layer, page, dtype). Checked on CPU only:
the same code with the copied kernels under the interpreter passes for float32 and float16
(bfloat16 dot products are wrong under the interpreter, docs/models.md).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def _mypyc_attr(*_args: object, **_kwargs: object) -> Callable[[type], type]:
    return lambda cls: cls


if importlib.util.find_spec("mypy_extensions") is None:
    # radix/pages.py's one outside import: a no-op class decorator in pure Python.
    stub = types.ModuleType("mypy_extensions")
    stub.mypyc_attr = _mypyc_attr  # type: ignore[attr-defined]
    sys.modules["mypy_extensions"] = stub

import torch  # noqa: E402
from attention_views import (  # noqa: E402
    HKV,
    HQ,
    PAGES,
    SWS,
    D,
    Layer,
    assert_misread_caught,
    assert_pool_strides,
    assert_read_right,
    engine_pages,
    fill,
    load_kernels,
)

from jenga_sglang.models.spec import AttentionGroup, DType, MambaGroup, ModelSpec  # noqa: E402
from jenga_sglang.pool.layout import PoolLayout, build_layout  # noqa: E402
from jenga_sglang.pool.sizing import geometry_for_spec  # noqa: E402
from jenga_sglang.radix.pages import PageKind, PageType  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KV0, KV1 = PageType(PageKind.KV, 0), PageType(PageKind.KV, 1)
TOKENS = 1024  # KV tokens of each pool


def _dtype(dtype: torch.dtype) -> DType:
    return next(d for d in DType if d.torch_name == str(dtype).removeprefix("torch."))


def _kv(name: str, dtype: torch.dtype) -> AttentionGroup:
    return AttentionGroup(name, 2, HKV, D, _dtype(dtype), 1.0, 1.0)


def _layout(spec: ModelSpec, page: int, device: str) -> PoolLayout:
    """binding/pools/build.py `paged_layout` on the GPU: unpadded pages, token-major above one
    token, a sink row in front."""
    geometry = geometry_for_spec(spec, tokens_per_page=page)
    for group in spec.attention_groups:
        index = spec.groups.index(group)
        tg = geometry.of(PageType(PageKind.KV, index))
        assert tg.page_bytes == page * group.kv_bytes_per_token, f"padded KV page: {tg}"
    num_large = math.ceil(TOKENS * spec.kv_bytes_per_token / geometry.large_page_bytes) + 2
    return build_layout(geometry, spec, num_large, device=device, sink=True, token_major=page > 1)


def _layer(layout: PoolLayout, ptype: PageType, page: int, parity: int | None) -> Layer:
    """Layer 1 of the type (the group's last), on every large page or on one parity."""
    views = layout.kv[ptype][1]
    k, v = views.k_slots, views.v_slots
    large = range(layout.num_large) if parity is None else range(parity, layout.num_large, 2)
    pages = engine_pages(k.shape[0], page, large, layout.geometry.of(ptype).per_large)
    return Layer(k, v, page, pages)


def _layers(
    page: int, dtype: torch.dtype, gen: torch.Generator, device: str
) -> Iterator[tuple[str, Layer]]:
    """The Mamba hybrid's last attention layer; the sliding-window pool's last window and last
    full layer, with sinks (pools/build.py `storage_spec` / `swa_storage_spec` shapes)."""
    dt = _dtype(dtype)
    mamba = MambaGroup("mamba", 2, (3, 8), dt, (1, 4, 8), dt, 1.0)
    hybrid = _layout(
        ModelSpec("gpu-hybrid", (_kv("kv", dtype), mamba), hidden_size=1), page, device
    )
    fill(hybrid, gen)
    yield "mamba-hybrid full", _layer(hybrid, KV0, page, None)
    groups = (_kv("full", dtype), _kv("window", dtype))
    swa = _layout(ModelSpec("gpu-swa", groups, hidden_size=1), page, device)
    fill(swa, gen)
    for name, ptype, parity, window in (("window", KV1, 0, SWS), ("full", KV0, 1, -1)):
        sinks = torch.randn(HQ, generator=gen).to(device)
        layer = _layer(swa, ptype, page, parity)
        yield f"sliding-window {name}", Layer(layer.k, layer.v, page, layer.pages, window, sinks)


def check(kernels: Any, device: str, dtypes: tuple[torch.dtype, ...]) -> int:
    """Every (pool, layer, page, dtype) case on `device`; returns the number that failed."""
    failures = 0
    for dtype in dtypes:
        for page in PAGES:
            gen = torch.Generator().manual_seed(page)
            for name, layer in _layers(page, dtype, gen, device):
                label = f"{name:<24} page {page:>2} {dtype!s:<15}"
                try:
                    assert_pool_strides(layer, layers_in_group=2)
                    assert_read_right(kernels, layer, gen)
                    assert_misread_caught(kernels, layer, gen)
                except AssertionError as exc:
                    failures += 1
                    print(f"FAIL {label} {exc}")
                else:
                    print(f"ok   {label}")
    return failures


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        print("needs a CUDA GPU and compiled Triton (TRITON_INTERPRET unset)", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    failures = check(load_kernels(), "cuda", DTYPES)
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
