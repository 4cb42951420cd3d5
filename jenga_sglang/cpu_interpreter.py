"""Run Triton kernels (ours, the reference libraries', SGLang's) with Triton's CPU interpreter.

One copy of the patches, used by the tests (tests/triton_cpu.py) and by the SGLang plugin when a
server runs on a machine without CUDA under ``TRITON_INTERPRET=1`` (docs/e2e-cpu.md). Nothing
here runs on a GPU machine: :func:`sglang_needs_cpu_patches` is False there.

What and why:
- ``torch.cuda.device`` / ``torch.cpu.device`` become no-op context managers: kernel launchers
  wrap launches in ``with torch.get_device_module(x.device).device(...)``, and ``torch.cpu`` has
  no ``device`` (``AttributeError: module 'torch.cpu' has no attribute 'device'``).
- Every autotuner uses only its first config: benchmarking configs needs a GPU driver even under
  the interpreter (``RuntimeError: 0 active drivers``) and would measure nothing on CPU. The
  patch acts when a kernel runs, so kernels defined before the patch are covered too.
- SGLang's ``MambaMixer2`` binds ``causal_conv1d_fn[_triton]`` / ``causal_conv1d_update[_triton]``
  only on CUDA, NPU and XPU; on CPU the names are missing (``NameError`` at the first prefill).
  We bind them to SGLang's portable Triton implementation, as its XPU branch does.
- ``Tensor.pin_memory()`` returns the tensor itself: pinned host memory exists only to speed up
  copies to a GPU, and without CUDA torch raises (``Found no NVIDIA driver``). SGLang guards
  every pin with ``is_pin_memory_available`` except one, the decode track mask of the
  extra_buffer strategy (``ScheduleBatch.prepare_for_decode``).
- SGLang's ``RotaryEmbedding`` takes a fallback kernel from ``vllm._custom_ops`` at construction
  on any machine that is neither CUDA nor its CPU engine (``ModuleNotFoundError: No module named
  'vllm'`` for every model with RoPE: Llama, Gemma 3, Falcon-H1, Qwen3.5...). Marking that
  module as on CPU skips the fallback; its forward is then dispatched to ``forward_native``
  (the pure-torch one) as before, since SGLang picks its CPU path only with AMX.
- SGLang's Gated DeltaNet kernels (Qwen3-Next, Qwen3.5): FLA's module-level ``tl`` math aliases,
  the chunk kernel's bfloat16-only assertion and the gated RMSNorm's SM count
  (jenga_sglang/cpu_gdn.py says why).
- Speculative decoding (NGRAM, and the draft models of STANDALONE, EAGLE and NEXTN): stand-ins
  for the six CUDA-only or silently empty pieces of its draft and verify steps
  (jenga_sglang/cpu_speculative.py says which and why).

The hooks that let SGLang take its ``extra_buffer`` snapshot path in this mode are in
jenga_sglang/binding/cpu_snapshots.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

_MAMBA_MIXER_MODULE = "sglang.srt.layers.attention.mamba.mamba"
_FIRST_CONFIG_FLAG = "_jenga_first_config_only"
_UNPINNED_FLAG = "_jenga_unpinned"


@contextlib.contextmanager
def _no_device(*_args: Any, **_kwargs: Any) -> Iterator[None]:
    yield


def patch_device_context() -> None:
    """``torch.cuda.device`` / ``torch.cpu.device`` as no-op context managers."""
    import torch

    torch.cuda.device = _no_device  # type: ignore[assignment,misc]
    torch.cpu.device = _no_device  # type: ignore[attr-defined]


def limit_autotuner() -> None:
    """Every ``triton.autotune`` kernel runs its first config, unbenchmarked (idempotent)."""
    from triton.runtime import autotuner

    original = autotuner.Autotuner.run
    if getattr(original, _FIRST_CONFIG_FLAG, False):
        return

    def run_first_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.configs = list(self.configs)[:1]
        return original(self, *args, **kwargs)

    setattr(run_first_config, _FIRST_CONFIG_FLAG, True)
    autotuner.Autotuner.run = run_first_config


def bind_sglang_conv_kernels() -> list[str]:
    """Bind the causal-conv names SGLang's Mamba mixer leaves unbound on CPU; returns them."""
    import importlib

    from sglang.kernels.ops.mamba import causal_conv1d_triton as portable

    mixer = importlib.import_module(_MAMBA_MIXER_MODULE)
    bound = []
    for name, kernel in (
        ("causal_conv1d_fn", portable.causal_conv1d_fn),
        ("causal_conv1d_fn_triton", portable.causal_conv1d_fn),
        ("causal_conv1d_update", portable.causal_conv1d_update),
        ("causal_conv1d_update_triton", portable.causal_conv1d_update),
    ):
        if not hasattr(mixer, name):
            setattr(mixer, name, kernel)
            bound.append(name)
    return bound


def patch_pin_memory() -> None:
    """``Tensor.pin_memory()`` hands back the tensor (no GPU: nothing to pin for); idempotent."""
    import torch

    if getattr(torch.Tensor.pin_memory, _UNPINNED_FLAG, False):
        return

    def unpinned(self: torch.Tensor, *_args: Any, **_kwargs: Any) -> torch.Tensor:
        return self

    setattr(unpinned, _UNPINNED_FLAG, True)
    torch.Tensor.pin_memory = unpinned  # type: ignore[method-assign,assignment]


def native_rope() -> None:
    """SGLang's RotaryEmbedding without the vllm fallback kernel (idempotent)."""
    import importlib

    rope = importlib.import_module("sglang.srt.layers.rotary_embedding.base")
    vars(rope)["_is_cpu"] = True  # read only by the fallback-kernel choice in __init__


def sglang_needs_cpu_patches() -> bool:
    """True in a process that serves with the Triton interpreter on a machine without CUDA."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    import torch

    return not torch.cuda.is_available()


def install_for_sglang() -> None:
    """All the patches, for an SGLang process (called from the plugin's ``register``)."""
    from jenga_sglang import cpu_gdn, cpu_speculative

    patch_device_context()
    limit_autotuner()
    patch_pin_memory()
    native_rope()
    bound = bind_sglang_conv_kernels() + cpu_gdn.install() + cpu_speculative.install()
    logger.info(
        "jenga: Triton CPU interpreter patches applied (pid %d; bound %s)",
        os.getpid(),
        ", ".join(bound) or "nothing",
    )
