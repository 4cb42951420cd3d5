"""Gated DeltaNet (Qwen3-Next, Qwen3.5) under Triton's CPU interpreter: the patches stock SGLang
0.5.23 needs to serve it on a machine without CUDA (the tiny Qwen3.5 of make e2e-models).

Applied by jenga_sglang/cpu_interpreter.py's ``install_for_sglang`` (the plugin's CPU mode), and
by the tests. SGLang's own Triton kernels (the vendored FLA ones) run unchanged; only how their
names resolve on CPU changes. What and why:

- FLA's ``op.py`` binds ``exp = tl.exp`` (and ``exp2``, ``log``, ``log2``) at module level, and
  the chunk / recurrent kernels import those names. The interpreter swaps in its own versions of
  the builtins only as attributes of ``triton.language`` while a kernel runs, so a module-level
  alias still holds the compiler's builtin, which raises ``Did you forget to add @triton.jit ?``
  outside the compiler. :func:`bind_fla_math_aliases` rebinds each alias to a ``@triton.jit``
  function that reaches the builtin through ``tl`` at call time (same code when compiled).
  Any SGLang module holding one of those builtins under that name is rebound the same way.
- SGLang's ``chunk_gated_delta_rule`` refuses float32 (``does not support float32. Please use
  bfloat16``): on a GPU its ``tl.dot``s would run float32 operands in TF32. The interpreter runs
  them as numpy float32 products, so float32 is exact there, while bfloat16 is wrong: Triton
  3.8's interpreter stores bfloat16 as raw ``uint16`` bits and its ``create_dot`` (and its
  elementwise ops) compute on those bits as integers (the order-1e9 outputs seen with
  ``--dtype bfloat16``). :func:`allow_float32_chunk` lets float32 through on CPU and refuses
  bfloat16 with that reason instead of computing garbage, so the model is served in its own
  float32 (tests/test_cpu_gdn.py checks the kernel against the recurrence
  and the served tokens against transformers).
- The gated RMSNorm after the GDN layer (FLA's ``layernorm_gated``) sizes its launch from the
  GPU's SM count, ``torch.cuda.get_device_properties`` (``Found no NVIDIA driver``).
  :func:`cpu_sm_count` answers 1 for a CPU tensor: the interpreter runs the programs one after
  another, so the fewest, widest blocks are the fastest; the count only picks rows per block.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any

_FLA = "sglang.kernels.ops.attention.fla"
_GDN_TRITON = "sglang.srt.layers.attention.linear.kernels.gdn_triton"
_MATH_ALIASES = ("exp", "exp2", "log", "log2")
_ANY_DTYPE_FLAG = "_jenga_any_dtype"
_CPU_SM_FLAG = "_jenga_cpu_sm_count"


def bind_fla_math_aliases() -> list[str]:
    """Rebind FLA's module-level ``tl`` math aliases in every loaded SGLang module that holds
    them (``op`` first, so later importers get the rebound names); returns ``module.name`` for
    each rebinding. Idempotent: a rebound name no longer holds the original builtin."""
    from jenga_sglang import _fla_cpu_math

    op = importlib.import_module(f"{_FLA}.op")
    replacements: dict[str, Callable[..., Any]] = {
        name: getattr(_fla_cpu_math, name) for name in _MATH_ALIASES
    }
    # Once op holds a replacement, every module loaded then was rebound and every later one
    # imported the replacement: nothing left to do for that name.
    originals = {
        name: vars(op)[name] for name in _MATH_ALIASES if vars(op)[name] is not replacements[name]
    }
    rebound = []
    # The scheduler imports the kernel modules before the plugin runs: rebind by identity in
    # every module already loaded (the vendored FLA package, SGLang's XPU copies, KDA...).
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("sglang."):
            continue
        namespace = vars(module)
        for name, original in originals.items():
            if namespace.get(name) is original:
                namespace[name] = replacements[name]
                rebound.append(f"{module_name.removeprefix(_FLA + '.')}.{name}")
    return rebound


def allow_float32_chunk() -> bool:
    """SGLang's GDN extend kernel accepts float32 q/k/v (it asserts bfloat16) and refuses
    bfloat16; returns True when it patched, False when already patched. Other dtypes (float16,
    which the interpreter computes as numpy float16) take SGLang's own function."""
    chunk = importlib.import_module(f"{_FLA}.chunk")
    gdn_triton = importlib.import_module(_GDN_TRITON)
    original = vars(gdn_triton)["chunk_gated_delta_rule"]
    if getattr(original, _ANY_DTYPE_FLAG, False):
        return False

    @functools.wraps(original)
    def chunk_gated_delta_rule(
        q: Any,
        k: Any,
        v: Any,
        g: Any,
        beta: Any,
        scale: float | None = None,
        initial_state: Any = None,
        initial_state_indices: Any = None,
        cu_seqlens: Any = None,
        head_first: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
        inplace_update: bool = True,
    ) -> tuple[Any, None, Any]:
        import torch

        if q.dtype == torch.bfloat16:
            # Its kernels would run, with outputs of order 1e9 (module docstring): refuse.
            raise RuntimeError(
                "Gated DeltaNet in bfloat16 under Triton's CPU interpreter: the interpreter "
                "computes bfloat16 dot products on the raw bits; serve with --dtype float32"
            )
        if q.dtype != torch.float32:
            return original(  # type: ignore[no-any-return]
                q, k, v, g, beta, scale, initial_state, initial_state_indices, cu_seqlens,
                head_first, use_qk_l2norm_in_kernel, inplace_update,
            )  # fmt: skip
        # SGLang's wrapper (fla/chunk.py) without its dtype assertion; its other checks kept.
        assert q.dtype == k.dtype == v.dtype
        assert beta.dim() == 3, "beta must be of shape [B, T, H] (head_first=False)"
        if head_first:
            raise ValueError("head_first is deprecated; SGLang's GDN backend passes False")
        if cu_seqlens is not None:
            if q.shape[0] != 1:
                raise ValueError("the batch size must be 1 with cu_seqlens")
            if initial_state_indices is not None and (
                initial_state_indices.shape[0] != len(cu_seqlens) - 1
            ):
                raise ValueError("one initial state index per input sequence is expected")
        if scale is None:
            scale = k.shape[-1] ** -0.5
        o, h = chunk.ChunkGatedDeltaRuleFunction.apply(
            q, k, v, g, beta, scale, initial_state, initial_state_indices, cu_seqlens,
            use_qk_l2norm_in_kernel, inplace_update,
        )  # fmt: skip
        return o, None, h

    setattr(chunk_gated_delta_rule, _ANY_DTYPE_FLAG, True)
    vars(gdn_triton)["chunk_gated_delta_rule"] = chunk_gated_delta_rule
    return True


def cpu_sm_count() -> bool:
    """FLA's gated RMSNorm sizes its launch for one SM on a CPU tensor; returns True when it
    patched, False when already patched."""
    norm = importlib.import_module(f"{_FLA}.layernorm_gated")
    original = vars(norm)["_get_sm_count"]
    if getattr(original, _CPU_SM_FLAG, False):
        return False

    def _get_sm_count(device: Any) -> int:
        return 1 if device.type == "cpu" else int(original(device))

    setattr(_get_sm_count, _CPU_SM_FLAG, True)
    vars(norm)["_get_sm_count"] = _get_sm_count  # read by calc_rows_per_block per call
    return True


def install() -> list[str]:
    """The three patches; returns what was done, for the plugin's log line."""
    done = [f"fla {name}" for name in bind_fla_math_aliases()]
    if allow_float32_chunk():
        done.append("float32 chunk_gated_delta_rule")
    if cpu_sm_count():
        done.append("layernorm_gated cpu sm count")
    return done
