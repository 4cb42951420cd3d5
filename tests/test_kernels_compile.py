"""Our Triton kernels compile for Hopper (sm_90) and Ampere (sm_80) on this CPU machine.

The interpreter runs a kernel's Python; only the compiler checks what a GPU requires (dot
shapes, operand dtypes, constexpr use). Triton compiles ahead of time for a target without a
GPU (its own ptxas ships in the wheel), so each kernel is compiled with the block sizes (every
autotuned tile) and dtypes its launcher uses, and every tile of the capture kernels must use the
tensor cores (wgmma or mma.sync on sm_90, mma.sync on sm_80): the point of the chunked capture
(issue #28). The test session runs under TRITON_INTERPRET, which replaces the compiler, so each
case compiles in a subprocess without it (`python -m tests.test_kernels_compile CASE ARCH`).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.exactness
ROOT = Path(__file__).resolve().parents[1]


def _compile(
    kernel: Any, pointers: dict[str, str], constexprs: dict[str, Any], arch: int, warps: int = 4
) -> Any:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(inspect.signature(kernel.fn).parameters)
    sig = {n: "i64" if n.startswith("s_") else "i32" for n in names}
    sig.update(pointers)
    sig.update(dict.fromkeys(constexprs, "constexpr"))
    keys = {(names.index(k),): v for k, v in constexprs.items()}
    src = ASTSource(fn=kernel, signature=sig, constexprs=keys)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})


def _tuned(tuner: Any, pointers: dict[str, str], constexprs: dict[str, Any], arch: int) -> set[str]:
    """Compile every config of an autotuned kernel; the matrix instructions they use (each
    config at least one: no tile falls back to scalar products)."""
    used: set[str] = set()
    for config in tuner.configs:
        compiled = _compile(
            tuner.fn, pointers, {**config.kwargs, **constexprs}, arch, config.num_warps
        )
        mma = _ptx_mma(compiled)
        assert mma, f"{config} compiles without matrix instructions"
        used |= mma
    return used


def _ptx_mma(compiled: Any) -> set[str]:
    ptx = compiled.asm["ptx"]
    return {op for op in ("wgmma.mma_async", "mma.sync") if op in ptx}


def _ssd(arch: int, act: str, precision: str) -> set[str]:
    from jenga_sglang.kernels.ssd_capture import _ssd_capture_kernel

    pointers = {n: f"*{act}" for n in ("x", "b")}
    pointers |= {n: "*fp32" for n in ("chunk_states", "row_states", "out", "dt", "cs")}
    pointers |= {n: "*i64" for n in ("chains", "chunk_src", "row_src", "dst_idx", "tok_start")}
    pointers |= {"n_tok": "*i64"}
    shapes = {"headdim": 64, "dstate": 128}  # Nemotron-H-8B's
    return _tuned(_ssd_capture_kernel, pointers, {"PRECISION": precision, **shapes}, arch)


def _gdn(arch: int) -> set[str]:
    from jenga_sglang.kernels.gdn_capture import _gdn_capture_kernel

    pointers = {n: "*bf16" for n in ("k", "v_new", "h")}
    pointers |= {"g": "*fp32", "out": "*fp32"}
    pointers |= {n: "*i64" for n in ("src_idx", "dst_idx", "tok_start", "n_tok")}
    shapes = {"vdim": 128, "kdim": 128}  # Qwen3-Next's
    return _tuned(_gdn_capture_kernel, pointers, {"PRECISION": "tf32x3", **shapes}, arch)


def _others(arch: int) -> set[str]:
    from jenga_sglang.kernels.conv_gather import _conv_gather_kernel
    from jenga_sglang.kernels.roll_forward import _roll_forward_kernel

    conv = {n: "*bf16" for n in ("xbc", "init", "out")}
    conv |= {n: "*i64" for n in ("init_idx", "dst_idx", "tok_start", "n_tok")}
    _compile(_conv_gather_kernel, conv, {"KM1": 3, "BLOCK_D": 1024}, arch)
    roll = {n: "*fp32" for n in ("state_in", "state_out", "x", "dt", "b", "a", "dt_bias")}
    roll |= {n: "*i64" for n in ("src_idx", "dst_idx", "tok_start", "n_tok")}
    roll |= {"dt_min": "fp32", "dt_max": "fp32"}
    consts = {"HAS_BIAS": True, "SOFTPLUS": True, "BLOCK_R": 64, "BLOCK_N": 128}
    return _ptx_mma(_compile(_roll_forward_kernel, roll, consts, arch))


CASES = {
    "ssd-fp32": lambda arch: _ssd(arch, "fp32", "tf32x3"),
    "ssd-bf16": lambda arch: _ssd(arch, "bf16", "tf32"),
    "gdn": _gdn,
    "others": _others,
}
# Hopper runs both; a tile under 64 rows cannot take wgmma (one warpgroup's minimum M).
TENSOR_CORES = {90: {"wgmma.mma_async", "mma.sync"}, 80: {"mma.sync"}}


def _run(case: str, arch: int) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.test_kernels_compile", case, str(arch)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("arch", [90, 80])
def test_capture_kernels_compile_onto_the_tensor_cores(arch: int) -> None:
    for case in ("ssd-fp32", "ssd-bf16", "gdn"):
        used = _run(case, arch)
        assert used and used <= TENSOR_CORES[arch], (case, used)
    if arch == 90:  # the 64-row Mamba2 tiles take Hopper's warpgroup products
        assert "wgmma.mma_async" in _run("ssd-fp32", arch)


def test_conv_gather_and_roll_forward_compile_without_matrix_products() -> None:
    assert _run("others", 90) == set()


if __name__ == "__main__":
    print(json.dumps(sorted(CASES[sys.argv[1]](int(sys.argv[2])))))
