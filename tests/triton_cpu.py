"""Run Triton kernels (ours and the reference libraries') on a CPU machine.

The one place that knows how: import this module before anything imports ``triton``,
``mamba_ssm``, ``causal_conv1d`` or SGLang's vendored Mamba kernels, then call :func:`setup`.

What it does, and why:
- ``TRITON_INTERPRET=1``: Triton executes kernels with its numpy interpreter instead of compiling.
- ``torch.cuda.device`` / ``torch.cpu.device`` become no-op context managers: the reference
  launchers wrap launches in ``with torch.cuda.device(x.device.index)``, which fails without CUDA.
- Every autotuner keeps only its first config: benchmarking configs under the interpreter costs
  minutes and measures nothing.
- ``selective_scan_cuda`` / ``causal_conv1d_cuda`` are CUDA extensions that the CPU source builds of
  mamba-ssm / causal-conv1d do not contain; placeholder modules let the pure-torch and Triton parts
  import. Calling into a placeholder raises, so nothing silently runs a fake.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")

_DONE = False
_CUDA_EXTENSIONS = ("selective_scan_cuda", "causal_conv1d_cuda")


@contextlib.contextmanager
def _no_device(*_args: Any, **_kwargs: Any) -> Iterator[None]:
    yield


def _placeholder(name: str) -> types.ModuleType:
    module = types.ModuleType(name)

    def _missing(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise RuntimeError(f"{name}.{attr} is a CUDA extension and is not available on CPU")

    module.__getattr__ = _missing  # type: ignore[method-assign]
    return module


def _limit_autotuner() -> None:
    from triton.runtime import autotuner

    original = autotuner.Autotuner.__init__
    if getattr(original, "_jenga_first_config_only", False):
        return

    def first_config_only(
        self: Any, fn: Any, arg_names: Any, configs: Any, *a: Any, **k: Any
    ) -> None:
        original(self, fn, arg_names, list(configs)[:1], *a, **k)

    setattr(first_config_only, "_jenga_first_config_only", True)  # noqa: B010
    autotuner.Autotuner.__init__ = first_config_only


def setup() -> None:
    """Apply the interpreter patches once (idempotent). Must run before the kernels are imported."""
    global _DONE
    if _DONE:
        return
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "TRITON_INTERPRET must be '1' before triton is imported (set it earlier)"
        )
    import torch

    torch.cuda.device = _no_device  # type: ignore[assignment,misc]
    torch.cpu.device = _no_device  # type: ignore[attr-defined]
    for name in _CUDA_EXTENSIONS:
        sys.modules.setdefault(name, _placeholder(name))
    _limit_autotuner()
    _DONE = True


def have(module: str) -> bool:
    """True when ``module`` can be found (used to skip cross-checks whose reference is missing)."""
    return importlib.util.find_spec(module) is not None


setup()
