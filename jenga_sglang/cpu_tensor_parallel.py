"""CPU-only test shim: SGLang's tensor parallelism (`--tp-size N`) without NCCL.

SGLang 0.5.23 sets up a pynccl communicator on every model-parallel group of more than one rank
(`parallel_state.init_model_parallel_group`, `use_pynccl` defaulting to True off NPU and XPU).
pynccl is NCCL: on a machine without a GPU its `ncclCommInitRank` fails ("unhandled cuda
error") and the scheduler dies at group init, stock SGLang too. Everything else of TP on CPU is
torch.distributed over gloo, which runs here.

This module exists for tests and benchmarks on CPU, not for serving: in the plugin's CPU
interpreter mode only (``TRITON_INTERPRET=1`` and no CUDA; jenga_sglang/cpu_interpreter.py) an
AROUND hook on `init_model_parallel_group` asks for no pynccl when the caller did not choose, so
the groups' collectives take SGLang's torch.distributed (gloo) path. On a GPU machine nothing is
hooked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

GROUP_INIT = "sglang.srt.distributed.parallel_state.init_model_parallel_group"


def around_group_init(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """SGLang's group init with pynccl off unless the caller asked for it explicitly."""
    if kwargs.get("use_pynccl") is None:
        kwargs["use_pynccl"] = False
        logger.info("jenga CPU test shim: %s without pynccl", kwargs.get("group_name"))
    return original(*args, **kwargs)


def register_hooks() -> bool:
    """Register the hook in the CPU interpreter mode only; True when registered."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from jenga_sglang.cpu_interpreter import sglang_needs_cpu_patches

    if not sglang_needs_cpu_patches():
        return False
    HookRegistry.register(GROUP_INIT, around_group_init, HookType.AROUND)
    return True
