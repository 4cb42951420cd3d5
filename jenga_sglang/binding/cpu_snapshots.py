"""SGLang's `extra_buffer` Mamba strategy (state snapshots, overlap scheduling) on a CPU.

SGLang 0.5.23 allows `--mamba-radix-cache-strategy extra_buffer` only on CUDA, MUSA, NPU, HIP
and XPU (`_platform_supports_mamba_cache_extra_buffer`). Every piece of the snapshot path is a
portable Triton kernel (the chunked scan returning tracked states, the state scatters) or torch
indexing, so in the plugin's CPU interpreter mode (``TRITON_INTERPRET=1``, no CUDA;
jenga_sglang/cpu_interpreter.py, which also makes ``Tensor.pin_memory`` a no-op for the one
unguarded pin on that path) the plugin registers, through SGLang's HookRegistry:

* AROUND the platform check: yes, SGLang's own answer otherwise;
* AFTER `validate_mamba_extra_buffer`: a start-up error when the model's dtype differs from the
  conv-state dtype. The snapshot writes activations into the conv state by index
  (`conv_state[idx] = x` in `MambaMixer2.forward`), which needs equal dtypes; conv states are
  bf16 unless ``SGLANG_MAMBA_CONV_DTYPE`` says otherwise, so a float32 or float16 model would
  crash at its first prefill. That is SGLang's fault on every platform; here it is a clear
  message at start.

docs/e2e-cpu.md lists exactly what differs from a CUDA server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

_MAMBA_HOOK = "sglang.srt.arg_groups.mamba_hook"
PLATFORM_CHECK = f"{_MAMBA_HOOK}._platform_supports_mamba_cache_extra_buffer"
VALIDATOR = f"{_MAMBA_HOOK}.validate_mamba_extra_buffer"


def around_platform_check(original: Callable[[], bool]) -> bool:
    """SGLang's "does this platform snapshot Mamba states?": yes under the CPU interpreter."""
    if original():
        return True
    from jenga_sglang.cpu_interpreter import sglang_needs_cpu_patches

    if sglang_needs_cpu_patches():
        logger.info("jenga: extra_buffer Mamba snapshots run in the Triton CPU interpreter")
        return True
    return False


def after_validate(result: Any, view: Any, hf_config: Any, *a: Any, **k: Any) -> None:
    """Fail at start, naming the fix, where the conv snapshot would crash at the first prefill."""
    from sglang.srt.configs.mamba_utils import mamba2_state_dtype
    from sglang.srt.configs.model_config import _get_and_verify_dtype

    model = _get_and_verify_dtype(hf_config, view.dtype)
    conv = mamba2_state_dtype(hf_config).conv
    if model != conv:
        name = str(model).removeprefix("torch.")
        raise ValueError(
            f"--mamba-radix-cache-strategy {view.mamba_radix_cache_strategy}: the model runs in "
            f"{name} but Mamba conv states are {str(conv).removeprefix('torch.')}, and SGLang's "
            f"snapshot copies activations into them by index (equal dtypes needed). Set "
            f"SGLANG_MAMBA_CONV_DTYPE={name} or serve with --dtype bfloat16 (conv-state default)."
        )


def register_hooks() -> None:
    """Register both hooks, in the CPU interpreter mode only (called by the plugin)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from jenga_sglang.cpu_interpreter import sglang_needs_cpu_patches

    if not sglang_needs_cpu_patches():
        return
    HookRegistry.register(PLATFORM_CHECK, around_platform_check, HookType.AROUND)
    HookRegistry.register(VALIDATOR, after_validate, HookType.AFTER)
