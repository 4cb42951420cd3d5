"""``@triton.jit`` stand-ins for FLA's module-level math aliases (jenga_sglang/cpu_gdn.py).

Each reaches its builtin through ``tl`` when called, where Triton's CPU interpreter has put its
own version while a kernel runs; compiled, each is the builtin inlined. Imported only in the
plugin's CPU mode (it imports triton).
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit  # type: ignore[untyped-decorator]
def exp(x: Any) -> Any:
    return tl.exp(x)


@triton.jit  # type: ignore[untyped-decorator]
def exp2(x: Any) -> Any:
    return tl.math.exp2(x)


@triton.jit  # type: ignore[untyped-decorator]
def log(x: Any) -> Any:
    return tl.log(x)


@triton.jit  # type: ignore[untyped-decorator]
def log2(x: Any) -> Any:
    return tl.log2(x)
