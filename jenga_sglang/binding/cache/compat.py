"""Which of SGLang 0.5.23's hybrid families `--enable-jenga` serves, checked at start-up.

The table lists every family SGLang serves with a Mamba, linear-attention or sliding-window
cache (its sglang/srt/configs/hybrid_arch.py, linear_attn_model_registry.py registrations and
the hybrid-SWA architecture list in configs/model_config.py), plus the plain full-attention
families we serve. docs/models.md is the same table in prose; tests/test_binding_compat.py
checks the two agree and that every hybrid-SWA architecture SGLang knows is listed.

`check_servable` runs in the radix-cache factory before anything is built: a family we do not
serve stops the server with an error naming the architecture and the missing piece, never a
silent fallback to another cache.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from jenga_sglang.models.spec import AttentionGroup, DType, ModelSpec


class UnsupportedModelError(NotImplementedError):
    """`--enable-jenga` was asked for a model we cannot serve yet (named in the message)."""


@dataclass(frozen=True)
class Family:
    """Architectures with one cache layout; `missing` is None when served."""

    name: str
    archs: tuple[str, ...]
    cache: str
    missing: str | None = None


_NO_SWA_SPEC = "no spec builder for its attention layout (window size, sinks, layer kinds)"
_MULTIMODAL = "multimodal wrapper: image/audio placeholders in the match key are not handled"

FAMILIES: tuple[Family, ...] = (
    Family("Nemotron-H", ("NemotronHForCausalLM",), "mamba2"),
    Family(
        "Nemotron-H Puzzle",
        ("NemotronHPuzzleForCausalLM",),
        "mamba2",
        "no spec builder for its per-layer block configs",
    ),
    Family("Falcon-H1", ("FalconH1ForCausalLM",), "mamba2"),
    Family("Granite 4.0-H", ("GraniteMoeHybridForCausalLM",), "mamba2"),
    Family("Mamba2", ("Mamba2ForCausalLM",), "mamba2"),
    Family("Qwen3-Next", ("Qwen3NextForCausalLM",), "gdn"),
    Family("Qwen3.5 text", ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"), "gdn"),
    Family("Gemma 3 text", ("Gemma3ForCausalLM",), "window-in-full-pool"),
    Family("gpt-oss", ("GptOssForCausalLM",), "swa"),
    Family(
        "Llama / Qwen2 / Qwen3",
        ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"),
        "full",
    ),
    Family(
        "Mamba1",
        ("MambaForCausalLM", "FalconMambaForCausalLM"),
        "mamba1",
        "Mamba1 state layout (conv + d_inner x d_state SSM state) has no spec builder",
    ),
    Family(
        "LFM2",
        ("Lfm2ForCausalLM", "Lfm2MoeForCausalLM"),
        "short-conv",
        "short-convolution state (conv only, no SSM state) has no spec builder",
    ),
    Family("Zaya", ("ZayaForCausalLM",), "mamba2", "no spec builder for Zaya's state layers"),
    Family(
        "Other Gated DeltaNet",
        ("JetNemotronForCausalLM", "GigaChat35ForCausalLM"),
        "gdn",
        "no spec builder for this Gated DeltaNet variant's config fields",
    ),
    Family(
        "KDA / lightning linear attention",
        ("KimiLinearForCausalLM", "BailingMoeV2_5ForCausalLM", "MiniCPMSALAForCausalLM"),
        "kda",
        "KDA / lightning-attention state layout has no spec builder",
    ),
    Family(
        "Hybrid multimodal",
        (
            "NemotronH_Nano_VL_V2",
            "Lfm2VlForConditionalGeneration",
            "JetVLMForConditionalGeneration",
            "InternS2PreviewForConditionalGeneration",
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5MoeForConditionalGeneration",
            "Glm5NextForConditionalGeneration",
        ),
        "multimodal",
        _MULTIMODAL,
    ),
    Family(
        "Other sliding window (SGLang SWA pool)",
        (
            "GraniteSWAForCausalLM",
            "GraniteMoeSWAForCausalLM",
            "IQuestQ1ForCausalLM",
            "Llama4ForConditionalGeneration",
            "DeepseekV4ForCausalLM",
            "MiMoV2ForCausalLM",
            "MiMoV2FlashForCausalLM",
            "Step3p5ForCausalLM",
            "Step3p7ForConditionalGeneration",
            "Gemma4ForCausalLM",
            "Gemma4ForConditionalGeneration",
            "LagunaForCausalLM",
            "MellumForCausalLM",
            "MuseGlimmerForCausalLM",
            "BeamForCausalLM",
            "UnlimitedOCRForCausalLM",
            "InklingForConditionalGeneration",
        ),
        "swa",
        _NO_SWA_SPEC,
    ),
)


def family_of(arch: str) -> Family | None:
    return next((f for f in FAMILIES if arch in f.archs), None)


def check_servable(arch: str, *, is_hybrid_swa: bool) -> None:
    """Raise UnsupportedModelError naming `arch` and the missing piece, or return."""
    family = family_of(arch)
    if family is not None and family.missing is not None:
        raise UnsupportedModelError(
            f"--enable-jenga: architecture {arch} ({family.name}) is not served: {family.missing}"
        )
    if is_hybrid_swa and (family is None or family.cache != "swa"):
        # a hybrid-SWA architecture newer than our table, or one we fold as full attention
        raise UnsupportedModelError(
            f"--enable-jenga: architecture {arch} is not served: SGLang gives it a "
            f"sliding-window pool and {_NO_SWA_SPEC}"
        )


def sglang_windows(spec: ModelSpec, window: int | None) -> ModelSpec:
    """The spec with every sliding window set to SGLang's retained window: the tokens before
    a position that its window layers read (gpt-oss: `sliding_window - 1`, the config counting
    the position itself) and a draft model may read more. The tree's window rule (a hit at p
    needs [p - w, p)) then hits exactly where SGLang's own cache does."""
    if window is None:
        return spec
    groups = tuple(
        replace(g, window=window) if isinstance(g, AttentionGroup) and g.window is not None else g
        for g in spec.groups
    )
    return replace(spec, groups=groups)


def fold_windows(spec: ModelSpec) -> ModelSpec:
    """The spec as SGLang's single KV pool stores it: window layers' KV kept for every token.

    For a model SGLang does not serve with its SWA pool (Gemma 3), the window only limits
    what attention reads; the pool and SGLang's own radix cache keep every token's KV in every
    layer. The tree then sees one full-attention group, and a hit is usable for every layer
    exactly when it is for SGLang's cache.
    """
    attention = spec.attention_groups
    if len(attention) < 2 and all(g.window is None for g in attention):
        return spec
    shapes = {(g.num_kv_heads, g.head_dim, g.dtype) for g in attention}
    if len(shapes) != 1:
        raise UnsupportedModelError(
            f"--enable-jenga: {spec.name}: attention groups of different KV shapes "
            f"{sorted(map(str, shapes))} in one KV pool are not supported"
        )
    first = attention[0]
    merged = replace(
        first,
        name="attention",
        num_layers=sum(g.num_layers for g in attention),
        window=None,
        linear_flops_per_token=_mean(attention, "linear_flops_per_token"),
        score_flops_per_pair=_mean(attention, "score_flops_per_pair"),
    )
    others = [g for g in spec.groups if not isinstance(g, AttentionGroup)]
    return replace(spec, groups=(merged, *others))


#: The token-slot group of an attention-free model (below): 1 layer x 1 head x 1 value of one
#: byte, K and V: 2 bytes per token.
TOKEN_SLOTS = "token-slots"


def with_token_slots(spec: ModelSpec) -> ModelSpec:
    """An attention-free spec (pure Mamba2) with a nominal group for SGLang's token slots.

    SGLang still gives every token a slot of its KV allocator (the request's row of
    `req_to_token`), and a prefix hit hands those slots to the request; the tree keeps them in
    an attention group's pages. No layer reads them, so the group has no FLOPs and a nominal
    2 bytes per token (the slot memory needs a positive page size; a state is thousands of
    times larger, so eviction values stay the states'). Its rule is the full-attention one:
    the slots of a held prefix are all there.
    """
    if spec.attention_groups:
        return spec
    slots = AttentionGroup(TOKEN_SLOTS, 1, 1, 1, DType.FP8, 0.0, 0.0)
    # The admission's shortest worthwhile branch compares KV with state bytes: no KV here.
    extra = {**spec.extra, "attention_free": True}
    return replace(spec, groups=(slots, *spec.groups), extra=extra)


def _mean(groups: tuple[AttentionGroup, ...], attr: str) -> float:
    """Per-layer value averaged over layers. The window's cap on score pairs is dropped, so
    eviction overrates recomputing a long Gemma 3 prefix (a cost estimate, not a hit rule)."""
    layers = sum(g.num_layers for g in groups)
    return float(sum(getattr(g, attr) * g.num_layers for g in groups)) / layers
