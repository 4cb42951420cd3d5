"""The SGLang plugin: entry point `jenga` in the group `sglang.srt.plugins`.

SGLang calls `register()` in launch_server before it parses arguments and again in every
scheduler process. It registers, through SGLang's own HookRegistry:

* AFTER `ServerArgs.add_cli_args`: our flags join SGLang's parser (so `--help` lists them);
* BEFORE `ServerArgs.from_cli_args`: conflicts fail with a message naming the flags (an
  attention backend the Jenga pool does not serve among them), `--enable-jenga` selects
  `--radix-cache-backend jenga` in the namespace SGLang reads, the flags the pool stands in
  for are dropped with a warning (binding/refusals.py `POOL_STANDS_IN`), and with the pool on a
  GPU and no attention backend named, `--attention-backend triton` (binding/options.py says
  why);
* AFTER `ServerArgs.from_cli_args`: our options ride on the record as a bookkeeping attribute,
  which `ServerArgs.__reduce__` pickles into the scheduler processes;
* on the batch, forward batch, the Mamba2 and Gated DeltaNet backends, their layers and
  chunked kernels: the prefill pass writes every planned SSM checkpoint into a slot allocated
  when the batch was built (binding/capture/forward.py, capture/mamba2.py, capture/gdn.py,
  captures.py);
* AROUND `PrefillAdder.add_one_req` / `add_chunked_req`: for models whose state layers the
  in-pass capture does not cover, a prefill chunk ends exactly at its planned branch point
  instead (binding/capture/prefill_cut.py);
* AROUND `KVCacheConfigurator._init_pools`, AFTER `KVCacheConfigurator.configure`: with
  `--jenga-pool` (default on) SGLang's KV and Mamba pools are views of one Jenga pool and its
  allocators draw from it (binding/pools/hook.py);
* AFTER `SchedulerPoolStatsObserver._get_mamba_token_info`: SGLang's Mamba usage figure over
  what states can hold now in that pool (binding/pools/usage.py);
* BEFORE `TokenizerManager._validate_one_request`: with `--enable-jenga`, token ids outside the
  vocabulary get a 400 instead of killing the scheduler (binding/vocab_check.py);

and the radix-cache backend `jenga` (registered before parsing, so the flag accepts the name).

On a machine without CUDA running under ``TRITON_INTERPRET=1`` it also applies the Triton CPU
interpreter patches (jenga_sglang/cpu_interpreter.py) in each process, so that stock SGLang can
serve a hybrid model on CPU (docs/e2e-cpu.md), and lets SGLang take its `extra_buffer`
snapshot path there (binding/cpu_snapshots.py) and, as a test shim, run `--tp-size N` without
pynccl (jenga_sglang/cpu_tensor_parallel.py) and stock `--enable-hierarchical-cache` with its
host copies in torch (jenga_sglang/cpu_hicache.py), and prefill-decode disaggregation with
Mooncake's transfer engine stood in for by one over loopback TCP (jenga_sglang/cpu_transfer.py);
elsewhere it changes nothing of SGLang's.
"""

from __future__ import annotations

import argparse
import copy
import logging
from typing import Any

from jenga_sglang.binding.options import (
    BACKEND_NAME,
    JENGA_ATTR,
    add_jenga_args,
    check_conflicts,
    drop_pool_stand_ins,
    hicache_tier,
    options_from_namespace,
    pool_attention_default,
)

_SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
_INT8_CHECK = "sglang.srt.arg_groups.mamba_hook.handle_int8_mamba_checkpoint"
logger = logging.getLogger(__name__)


def _after_add_cli_args(result: Any, parser: argparse.ArgumentParser, *a: Any, **k: Any) -> None:
    add_jenga_args(parser)


def _before_from_cli_args(cls: Any, args: argparse.Namespace) -> None:
    check_conflicts(args)
    if getattr(args, "enable_jenga", False):
        args.radix_cache_backend = BACKEND_NAME
        _hicache_to_our_tier(args)
        for warning in drop_pool_stand_ins(args):  # e.g. --enable-unified-memory
            logger.warning(warning)
    backend = pool_attention_default(args, _cuda_available())
    if backend is not None:
        args.attention_backend = backend
        # A warning: logging is not configured yet in launch_server, and the choice changes
        # SGLang's default kernels (fa3 / flashinfer / trtllm_mha would be picked here).
        logger.warning(
            "jenga: --jenga-pool serves --attention-backend %s (none named for prefill or decode); "
            "SGLang's GPU defaults are not checked on the pool's strided KV views. Pass "
            "--no-jenga-pool to use them.",
            backend,
        )


def _hicache_to_our_tier(args: argparse.Namespace) -> None:
    """`--enable-hierarchical-cache` asks for a host tier: ours, sized by HiCache's flags, and
    SGLang's is turned off so the scheduler builds none of its controller around our tree."""
    sized = hicache_tier(args)
    if sized is None:
        return
    args.jenga_host_gb, args.jenga_host_ratio = sized
    args.enable_hierarchical_cache = False
    logger.warning(
        "jenga: --enable-hierarchical-cache is served by jenga's host tier (%s; "
        "docs/host-tier.md): it demotes what eviction would drop, FLOP-aware; "
        "--hicache-write-policy, --hicache-io-backend and --hicache-mem-layout are SGLang "
        "HiCache's and do not apply",
        f"{sized[0]:g} GB" if sized[0] else f"{sized[1]:g}x the device pools",
    )


def _around_int8_check(original: Any, server_args: Any) -> Any:
    """SGLang refuses `--enable-int8-mamba-checkpoint` beside any `--radix-cache-backend` as
    not int8-aware. Ours is (binding/cache/mamba_state.py), so its other checks (HiCache,
    LMCache) run as for the built-in cache, on a copy: the arguments stay as they are."""
    if getattr(server_args, "radix_cache_backend", None) != BACKEND_NAME:
        return original(server_args)
    view = copy.copy(server_args)
    view.radix_cache_backend = None
    return original(view)


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _after_from_cli_args(result: Any, cls: Any, args: argparse.Namespace) -> None:
    setattr(result, JENGA_ATTR, options_from_namespace(args))


def register() -> None:
    """Entry point: idempotent, safe to call in every process."""
    from sglang.srt.mem_cache.registry import (
        register_radix_cache_backend,
        registered_radix_cache_backends,
    )
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from jenga_sglang import cpu_hicache, cpu_tensor_parallel, cpu_transfer
    from jenga_sglang.binding import cpu_snapshots, vocab_check
    from jenga_sglang.binding.cache.factory import build_tree_cache
    from jenga_sglang.binding.capture import forward as capture_forward
    from jenga_sglang.binding.capture import gdn as capture_gdn
    from jenga_sglang.binding.capture import mamba2 as capture_mamba2
    from jenga_sglang.binding.capture import prefill_cut
    from jenga_sglang.binding.pools import hook as pool_hook
    from jenga_sglang.binding.pools import usage
    from jenga_sglang.cpu_interpreter import install_for_sglang, sglang_needs_cpu_patches

    if sglang_needs_cpu_patches():
        install_for_sglang()  # idempotent: safe before the early return below
        cpu_transfer.install()  # PD's transfer engine over TCP: a CPU test shim, same mode
    if BACKEND_NAME in registered_radix_cache_backends():
        return
    register_radix_cache_backend(BACKEND_NAME, build_tree_cache)
    HookRegistry.register(f"{_SERVER_ARGS}.add_cli_args", _after_add_cli_args, HookType.AFTER)
    HookRegistry.register(f"{_SERVER_ARGS}.from_cli_args", _before_from_cli_args, HookType.BEFORE)
    HookRegistry.register(f"{_SERVER_ARGS}.from_cli_args", _after_from_cli_args, HookType.AFTER)
    HookRegistry.register(_INT8_CHECK, _around_int8_check, HookType.AROUND)
    adder = prefill_cut.ADDER
    HookRegistry.register(f"{adder}.add_one_req", prefill_cut.around_add_one_req, HookType.AROUND)
    HookRegistry.register(
        f"{adder}.add_chunked_req", prefill_cut.around_add_chunked_req, HookType.AROUND
    )
    configurator = pool_hook.CONFIGURATOR
    HookRegistry.register(
        f"{configurator}._init_pools", pool_hook.around_init_pools, HookType.AROUND
    )
    HookRegistry.register(f"{configurator}.configure", pool_hook.after_configure, HookType.AFTER)
    for captures in (capture_forward, capture_mamba2, capture_gdn):
        captures.register(HookRegistry, HookType)
    usage.register(HookRegistry, HookType)
    vocab_check.register(HookRegistry, HookType)
    cpu_snapshots.register_hooks()  # extra_buffer on CPU: interpreter mode only
    cpu_tensor_parallel.register_hooks()  # TP without pynccl: a CPU test shim, same mode only
    cpu_hicache.register_hooks()  # stock HiCache's host copies in torch: a CPU test shim, too
