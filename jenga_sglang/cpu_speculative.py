"""Speculative decoding under Triton's CPU interpreter: stand-ins for SGLang's CUDA-only pieces.

Part of the CPU interpreter mode (jenga_sglang/cpu_interpreter.py): installed only in a process
that serves with ``TRITON_INTERPRET=1`` on a machine without CUDA, so a GPU server never runs
any of it. There SGLang 0.5.23's platform checks (``is_cuda``, ``is_cpu``, ``is_xpu``) are all
false, and its speculative path breaks in six places (docs/sglang.md, "Speculative decoding"):

- ``reconstruct_tree`` imports ``sgl_kernel.speculative`` (not installed): NGRAM's worker fails at
  import. Stand-in: a ``sgl_kernel.speculative`` module whose op is SGLang's own Triton version
  (the one its XPU branch calls), bit-identical in contract.
- ``verify_tree_greedy_func`` matches no platform and silently accepts nothing; the stand-in
  calls SGLang's Triton ``verify_tree_greedy_triton`` (its XPU branch).
- ``build_tree_kernel_efficient_func`` (a draft model's proposals into the verify tree) matches
  no platform and calls an ``sgl_kernel`` op that is not there; the stand-in calls SGLang's
  Triton ``sgl_build_tree_kernel_triton`` (its XPU branch).
- NemotronH's ``set_embed_and_head`` (an MTP draft, NEXTN, takes the target's embedding and
  head) ends in ``torch.cuda.synchronize()``, which raises without a GPU driver; the stand-in
  makes the same swap without the CUDA calls (they only free and wait for GPU memory).
- ``assign_extend_cache_locs_func`` matches no platform and returns None; the stand-in is the
  same gather in torch: each request's KV slots at [seq_len, seq_len + draft tokens).
- ``scatter_mamba_states_after_mtp_verify``'s fused kernels refuse CPU tensors; the stand-in
  does the same copy in torch: each request's live slot (and, with extra_buffer, its track slot)
  takes the verify scratch's state after the step SGLang chose.

Each is a stand-in for this machine only, named here and in docs/e2e-cpu.md.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

_FLAG = "_jenga_cpu_speculative"
_SPEC = "sglang.kernels.ops.speculative"


def _reconstruct_indices_from_tree_mask(*args: Any) -> None:
    """``sgl_kernel.speculative.reconstruct_indices_from_tree_mask``: SGLang's Triton version."""
    tree = importlib.import_module(f"{_SPEC}.reconstruct_tree")
    tree.reconstruct_indices_from_tree_mask_triton(*args)


def stub_sgl_kernel_speculative() -> bool:
    """A ``sgl_kernel.speculative`` module holding the one op NGRAM imports; True if added."""
    if "sgl_kernel.speculative" in sys.modules:
        return False
    module = types.ModuleType("sgl_kernel.speculative")
    module.__doc__ = "jenga_sglang CPU interpreter stand-in (jenga_sglang/cpu_speculative.py)"
    vars(module)["reconstruct_indices_from_tree_mask"] = _reconstruct_indices_from_tree_mask
    sys.modules["sgl_kernel.speculative"] = module
    return True


def verify_tree_greedy(
    predicts: Any,
    accept_index: Any,
    accept_token_num: Any,
    candidates: Any,
    retrieve_index: Any,
    retrieve_next_token: Any,
    retrieve_next_sibling: Any,
    target_predict: Any,
    topk: int = -1,
) -> tuple[Any, Any, Any]:
    """``verify_tree_greedy_func`` through SGLang's Triton kernel (``topk``: unused there too)."""
    tree = importlib.import_module(f"{_SPEC}.spec_tree")
    tree.verify_tree_greedy_triton(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_token_num,
        candidates=candidates,
        retrieve_index=retrieve_index,
        retrieve_next_token=retrieve_next_token,
        retrieve_next_sibling=retrieve_next_sibling,
        target_predict=target_predict,
    )
    return predicts, accept_index, accept_token_num


def build_tree(*args: Any) -> None:
    """``build_tree_kernel_efficient_func`` through SGLang's Triton kernel (its XPU branch)."""
    tree = importlib.import_module(f"{_SPEC}.spec_tree")
    tree.sgl_build_tree_kernel_triton(*args)


def set_embed_and_head(model: Any, embed: Any, head: Any) -> None:
    """NemotronH's embedding and head swap, without its CUDA cache release and sync."""
    del model.model.embed_tokens.weight
    del model.lm_head.weight
    model.model.embed_tokens.weight = embed
    model.lm_head.weight = head


def assign_extend_cache_locs(
    req_pool_indices: Any,
    req_to_token: Any,
    start_offset: Any,
    end_offset: Any,
    batch_size: int,
    draft_token_num: int,
    device: Any,
) -> Any:
    """The KV slots of each request's positions [start, start + draft_token_num), flattened."""
    import torch

    del end_offset, batch_size  # start + draft_token_num, and len(req_pool_indices)
    steps = torch.arange(draft_token_num, device=req_to_token.device)
    columns = start_offset.to(torch.int64).view(-1, 1) + steps
    rows = req_pool_indices.to(torch.int64).view(-1, 1)
    return req_to_token[rows, columns].reshape(-1).to(torch.int64).to(device)


def scatter_mamba_states_after_verify(
    mamba_caches: Any,
    state_indices_tensor: Any,
    last_correct_step_indices: Any,
    mamba_track_indices: Any,
    mamba_steps_to_track: Any,
    src_indices_raw: Any = None,
) -> None:
    """For request row i: slot ``state_indices_tensor[i]`` takes the scratch state after step
    ``last_correct_step_indices[i]``, and ``mamba_track_indices[i]`` the one after
    ``mamba_steps_to_track[i]`` (a negative step: no copy); ``src_indices_raw`` names the scratch
    rows where they are not 0..n-1 (pipeline parallelism)."""
    _scatter(mamba_caches, state_indices_tensor, last_correct_step_indices, src_indices_raw)
    if mamba_track_indices is not None:
        _scatter(mamba_caches, mamba_track_indices, mamba_steps_to_track, src_indices_raw)


def _scatter(caches: Any, slots: Any, steps: Any, rows: Any) -> None:
    slot_list = [int(x) for x in slots.tolist()]
    step_list = [int(x) for x in steps.tolist()]
    row_list = list(range(len(step_list))) if rows is None else [int(x) for x in rows.tolist()]
    for slot, step, row in zip(slot_list, step_list, row_list, strict=False):
        if step < 0:
            continue
        if caches.temporal.numel() > 0:
            caches.temporal[:, slot] = caches.intermediate_ssm[:, row, step]
        for conv, window in zip(caches.conv, caches.intermediate_conv_window, strict=True):
            if conv.numel() > 0:
                conv[:, slot] = window[:, row, step]


def install() -> list[str]:
    """The stand-ins (idempotent); returns what was done, for the plugin's log line."""
    done = ["sgl_kernel.speculative"] if stub_sgl_kernel_speculative() else []
    eagle = importlib.import_module("sglang.srt.speculative.eagle_utils")
    if getattr(vars(eagle)["verify_tree_greedy_func"], _FLAG, False):
        return done
    locs = "assign_extend_cache_locs_func"
    replacements: list[tuple[str, str, Any]] = [
        ("sglang.srt.speculative.eagle_utils", "verify_tree_greedy_func", verify_tree_greedy),
        ("sglang.srt.speculative.eagle_utils", "build_tree_kernel_efficient_func", build_tree),
        (f"{_SPEC}.spec_tree", "verify_tree_greedy_func", verify_tree_greedy),
        ("sglang.srt.speculative.ngram_worker", locs, assign_extend_cache_locs),
        (f"{_SPEC}.cache_locs", locs, assign_extend_cache_locs),
        (
            "sglang.srt.layers.attention.hybrid_linear_attn_backend",
            "scatter_mamba_states_after_mtp_verify",
            scatter_mamba_states_after_verify,
        ),
    ]
    nemotron_h = importlib.import_module("sglang.srt.models.nemotron_h")
    model_class = vars(nemotron_h)["NemotronHForCausalLM"]
    assert "set_embed_and_head" in vars(model_class), "NemotronH's swap moved: recheck"
    setattr(set_embed_and_head, _FLAG, True)
    model_class.set_embed_and_head = set_embed_and_head  # the MTP subclass inherits it
    done.append("NemotronHForCausalLM.set_embed_and_head")
    for module_name, name, stand_in in replacements:
        module = importlib.import_module(module_name)
        assert name in vars(module), f"{module_name}.{name} is gone: recheck the stand-ins"
        setattr(stand_in, _FLAG, True)
        vars(module)[name] = stand_in
        done.append(name)
    return done
