"""The `jenga` radix-cache factory: model spec from SGLang's model config, then the backend."""

from __future__ import annotations

from typing import Any

from jenga_sglang.binding.cache.compat import (
    UnsupportedModelError,
    check_servable,
    fold_windows,
    sglang_windows,
    with_token_slots,
)
from jenga_sglang.binding.options import JengaOptions, options_of
from jenga_sglang.models.config import spec_from_hf_config, supported_architectures
from jenga_sglang.models.hf_fields import ConfigError
from jenga_sglang.models.spec import ModelSpec, int8_checkpoints, states_from_peer

#: Architectures whose SSM layers are SGLang's `MambaMixer2` (sglang/srt/models/nemotron_h.py,
#: mamba2.py, granitemoehybrid.py, falcon_h1.py; tests/test_inpass_capture.py checks the list
#: against those files). The in-pass capture hooks extend that mixer's prefill
#: (binding/capture/mamba2.py) and SGLang's Gated DeltaNet backend (binding/capture/gdn.py);
#: other state layers (KDA, short conv, lightning) fall back to cutting the chunk
#: (binding/capture/prefill_cut.py).
MAMBA2_MIXER_ARCHS = frozenset(
    {
        "NemotronHForCausalLM",
        "NemotronHPuzzleForCausalLM",
        "Mamba2ForCausalLM",
        "GraniteMoeHybridForCausalLM",
        "FalconH1ForCausalLM",
    }
)


def captures_in_pass(model_config: Any) -> bool:
    """Whether the forward of this model writes our planned states in-pass: its state layers
    are all `MambaMixer2`, or SGLang runs them on its Gated DeltaNet backend (the test SGLang's
    attention registry applies: `hybrid_gdn_config`)."""
    archs = getattr(model_config.hf_config, "architectures", None) or []
    if archs and all(a in MAMBA2_MIXER_ARCHS for a in archs):
        return True
    from sglang.srt.configs.hybrid_arch import hybrid_gdn_config

    return hybrid_gdn_config(model_config) is not None


__all__ = [
    "MAMBA2_MIXER_ARCHS",
    "UnsupportedModelError",
    "build_tree_cache",
    "captures_in_pass",
    "check_decode_tree",
    "decode_radix_cache",
    "spec_from_model_config",
]


def decode_radix_cache() -> bool:
    """This scheduler is a PD decode worker with a radix cache of its own
    (`--disaggregation-mode decode --disaggregation-decode-enable-radix-cache`)."""
    from sglang.srt.runtime_context import get_disagg

    disagg = get_disagg()
    return disagg.disaggregation_mode == "decode" and bool(
        disagg.disaggregation_decode_enable_radix_cache
    )


def check_decode_tree(spec: ModelSpec) -> None:
    """What a decode worker's tree with states from the prefill side does not serve:
    sliding-window groups (SGLang transfers their window tail fresh and caps the decode
    match short of it, a rule our window group does not have)."""
    windows = [g.name for g in spec.attention_groups if g.window is not None]
    if windows:
        raise UnsupportedModelError(
            "--enable-jenga with --disaggregation-decode-enable-radix-cache serves hybrid "
            f"Mamba models, not sliding-window groups ({', '.join(windows)}): drop the flag on "
            "the decode side or leave that side without --enable-jenga"
        )


def spec_from_model_config(model_config: Any, tp_size: int) -> ModelSpec:
    """ModelSpec of this tensor-parallel rank's shard, from SGLang's ModelConfig.hf_config."""
    hf = getattr(model_config, "hf_text_config", None) or model_config.hf_config
    config = hf.to_dict() if hasattr(hf, "to_dict") else dict(hf)
    archs = config.get("architectures") or getattr(model_config.hf_config, "architectures", None)
    config["architectures"] = archs
    try:
        return spec_from_hf_config(config, tp_size=tp_size)
    except ConfigError as exc:
        raise UnsupportedModelError(
            f"--enable-jenga: cannot serve architecture {archs}: {exc}. "
            f"Supported: {', '.join(supported_architectures())}"
        ) from None


def build_tree_cache(ctx: Any) -> Any:
    """`RadixCacheFactory` for `--radix-cache-backend jenga` (called in each scheduler)."""
    from jenga_sglang.binding.cache.backend import JengaRadixCache
    from jenga_sglang.binding.cache.namespaces import event_labels
    from jenga_sglang.binding.cache.tp_consensus import ConsensusJengaRadixCache, checker_requested
    from jenga_sglang.binding.slots.kv_events import attach as attach_events

    options = options_of(ctx.server_args)
    if not options.enabled:
        options = JengaOptions(enabled=True)  # selected by --radix-cache-backend jenga alone
    archs = getattr(ctx.model_config.hf_config, "architectures", None) or ["(none)"]
    check_servable(archs[0], is_hybrid_swa=bool(ctx.is_hybrid_swa))  # docs/models.md
    spec = spec_from_model_config(ctx.model_config, ctx.tp_size)
    if ctx.is_hybrid_swa:  # SGLang's SWA pool: the tree keeps a window group (window_slots)
        spec = sglang_windows(spec, ctx.params.swa_retain_window)
    else:  # one KV pool keeps every layer's KV for every token
        spec = fold_windows(spec)
    spec = with_token_slots(spec)  # pure Mamba2: SGLang's token slots still need a group
    if decode_radix_cache():  # a PD decode worker's own radix cache
        check_decode_tree(spec)
        if spec.has_mamba:  # hits need the KV alone: the state comes with the KV suffix
            spec = states_from_peer(spec)
    if getattr(ctx.params.req_to_token_pool, "mamba_ckpt_pool", None) is not None:
        spec = int8_checkpoints(spec)  # the tree's states are SGLang's int8 checkpoints
    inpass = options.capture == "in-pass" and captures_in_pass(ctx.model_config)
    # SGLang's rank-consensus checker on: the same cache with its marks (cache/tp_consensus.py)
    cls = ConsensusJengaRadixCache if checker_requested() else JengaRadixCache
    cache = cls(ctx.params, spec, options, inpass=inpass)
    # --kv-events-config: publish only spans a hit can use (slots/kv_events.py), each store
    # naming its namespace as SGLang's cache does (cache salt, LoRA adapter name)
    labels = event_labels(getattr(ctx.params, "kv_event_lora_names", None))
    attach_events(cache, bool(getattr(ctx.params, "enable_kv_cache_events", False)), labels)
    return cache
