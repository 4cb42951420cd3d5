"""Run Triton kernels (ours and the reference libraries') on a CPU machine.

The one place that knows how: import this module before anything imports ``triton``,
``mamba_ssm``, ``causal_conv1d`` or SGLang's vendored Mamba kernels, then call :func:`setup`.

What it does, and why:
- ``TRITON_INTERPRET=1``: Triton executes kernels with its numpy interpreter instead of compiling.
- The device-context and autotuner patches of jenga_sglang/cpu_interpreter.py (shared with the
  SGLang plugin's CPU serving path).
- ``selective_scan_cuda`` / ``causal_conv1d_cuda`` are CUDA extensions that the CPU source builds of
  mamba-ssm / causal-conv1d do not contain; placeholder modules let the pure-torch and Triton parts
  import. Calling into a placeholder raises, so nothing silently runs a fake.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")

from jenga_sglang.cpu_interpreter import limit_autotuner, patch_device_context

_DONE = False
_CUDA_EXTENSIONS = ("selective_scan_cuda", "causal_conv1d_cuda")


def _placeholder(name: str) -> types.ModuleType:
    module = types.ModuleType(name)

    def _missing(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise RuntimeError(f"{name}.{attr} is a CUDA extension and is not available on CPU")

    module.__getattr__ = _missing  # type: ignore[method-assign]
    return module


def setup() -> None:
    """Apply the interpreter patches once (idempotent). Must run before the kernels are imported."""
    global _DONE
    if _DONE:
        return
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "TRITON_INTERPRET must be '1' before triton is imported (set it earlier)"
        )
    patch_device_context()
    for name in _CUDA_EXTENSIONS:
        sys.modules.setdefault(name, _placeholder(name))
    limit_autotuner()
    _DONE = True


def have(module: str) -> bool:
    """True when ``module`` can be found (used to skip cross-checks whose reference is missing)."""
    return importlib.util.find_spec(module) is not None


setup()
