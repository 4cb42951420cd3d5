"""The start-up compatibility check (binding/cache/compat.py) and docs/models.md agree with
SGLang."""

from __future__ import annotations

import ast
import inspect
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jenga_sglang.bench.drivers.tiny_families import family_config
from jenga_sglang.binding.cache.compat import (
    FAMILIES,
    UnsupportedModelError,
    check_servable,
    family_of,
    fold_windows,
)
from jenga_sglang.binding.cache.factory import build_tree_cache
from jenga_sglang.models import spec_from_hf_config

ROOT = Path(__file__).resolve().parents[1]
REFUSED = [(arch, f) for f in FAMILIES if f.missing for arch in f.archs]
SERVED = [arch for f in FAMILIES if not f.missing for arch in f.archs]


@pytest.mark.parametrize(("arch", "family"), REFUSED, ids=[a for a, _ in REFUSED])
def test_refused_architecture_names_itself_and_the_missing_piece(arch: str, family: Any) -> None:
    with pytest.raises(UnsupportedModelError) as info:
        check_servable(arch, is_hybrid_swa=False)
    assert arch in str(info.value) and family.missing in str(info.value)


def test_served_architectures_pass_and_have_a_spec_builder() -> None:
    from jenga_sglang.models import supported_architectures

    for arch in SERVED:
        check_servable(arch, is_hybrid_swa=False)
        assert arch in supported_architectures(), arch


def test_an_unlisted_hybrid_swa_architecture_is_refused() -> None:
    with pytest.raises(UnsupportedModelError, match=r"NewSwaForCausalLM.*sliding-window pool"):
        check_servable("NewSwaForCausalLM", is_hybrid_swa=True)
    # a family we fold as full attention is refused when SGLang gives it an SWA pool
    with pytest.raises(UnsupportedModelError, match=r"Gemma3ForCausalLM.*sliding-window pool"):
        check_servable("Gemma3ForCausalLM", is_hybrid_swa=True)
    check_servable("GptOssForCausalLM", is_hybrid_swa=True)


def test_every_hybrid_swa_architecture_sglang_names_is_in_the_table() -> None:
    """The literal architecture names in SGLang's `is_hybrid_swa_model`, and the SWA sink / MiMo
    sets it includes, are all in our table: served with a window group, or refused."""
    from sglang.srt.configs import model_config as mc

    tree = ast.parse(inspect.getsource(mc.is_hybrid_swa_model))
    names = {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value[:1].isupper()
    }
    names |= set(mc.SWA_SINK_ARCHS) | set(mc.MIMO_V2_MODEL_ARCHS)
    names -= {"MiMoV2MTP", "Step3p5MTP", "DeepseekV4ForCausalLMNextN"}  # draft models
    names -= {"DeepseekV4ForCausalLMDSpark", "IQuestQ1MTP", "InklingForConditionalGenerationMTP"}
    names -= {"EmbeddingGemma2Model", "DiffusionGemmaForBlockDiffusion"}  # not generative LMs
    names -= {"Gemma4UnifiedForConditionalGeneration", "MuseGlimmerForConditionalGeneration"}
    assert len(names) > 10
    missing = sorted(n for n in names if family_of(n) is None)
    assert not missing, f"hybrid-SWA architectures not in compat.FAMILIES: {missing}"
    served = sorted(n for n in names if family_of(n).missing is None)  # type: ignore[union-attr]
    assert served == ["GptOssForCausalLM"]
    assert all(family_of(n).cache == "swa" for n in names)  # type: ignore[union-attr]


def test_docs_table_lists_every_architecture_with_its_status() -> None:
    text = (ROOT / "docs" / "models.md").read_text()
    for family in FAMILIES:
        for arch in family.archs:
            row = next((ln for ln in text.splitlines() if f"`{arch}`" in ln), None)
            assert row is not None, f"docs/models.md does not list {arch}"
            status = "**served**" if family.missing is None else "refused"
            assert status in row, row


def test_gemma3_windows_fold_into_one_full_group_as_sglangs_pool_stores_them() -> None:
    spec = spec_from_hf_config(family_config("gemma3", 512))
    assert [g.window for g in spec.attention_groups] == [None, 32]
    folded = fold_windows(spec)
    assert len(folded.attention_groups) == 1 and folded.attention_groups[0].window is None
    assert folded.kv_bytes_per_token == spec.kv_bytes_per_token
    assert folded.attention_groups[0].num_layers == 4
    plain = spec_from_hf_config(family_config("llama", 512))
    assert fold_windows(plain) is plain


def _ctx(config: dict[str, Any], *, is_hybrid_swa: bool) -> SimpleNamespace:
    hf = SimpleNamespace(architectures=config["architectures"], to_dict=lambda: dict(config))
    model_config = SimpleNamespace(hf_config=hf, hf_text_config=hf)
    return SimpleNamespace(
        server_args=SimpleNamespace(),
        model_config=model_config,
        tp_size=1,
        is_hybrid_swa=is_hybrid_swa,
        params=None,  # never reached: the check runs before the backend is built
    )


def test_factory_refuses_an_swa_pool_model_without_builder_before_building_anything() -> None:
    config = {"architectures": ["MellumForCausalLM"], "hidden_size": 64}
    with pytest.raises(UnsupportedModelError, match=r"MellumForCausalLM .*no spec builder"):
        build_tree_cache(_ctx(config, is_hybrid_swa=True))


def test_factory_refuses_a_family_without_builder_by_name() -> None:
    config = {"architectures": ["MambaForCausalLM"], "hidden_size": 64}
    with pytest.raises(UnsupportedModelError, match=r"MambaForCausalLM.*Mamba1 state layout"):
        build_tree_cache(_ctx(config, is_hybrid_swa=False))


def test_tiny_family_configs_build_specs_that_match_their_layer_mix() -> None:
    expect = {
        "falcon_h1": {"attention": 4, "mamba": 4},
        "granite_moe_hybrid": {"attention": 1, "mamba": 3},
        "mamba2": {"mamba": 4},
        "qwen3_5": {"attention": 1, "mamba": 3},
        "llama": {"attention": 4},
    }
    for family, layers in expect.items():
        spec = spec_from_hf_config(family_config(family, 512))
        got = {g.name: g.num_layers for g in (*spec.attention_groups, *spec.mamba_groups)}
        assert got == layers, (family, got)
        assert json.loads(json.dumps(family_config(family, 512)))["architectures"]


def test_pure_mamba2_gets_a_nominal_token_slot_group_and_keeps_its_state() -> None:
    from jenga_sglang.binding.cache.compat import TOKEN_SLOTS, with_token_slots

    spec = spec_from_hf_config(family_config("mamba2", 512))
    assert not spec.attention_groups
    slotted = with_token_slots(spec)
    (slots,) = slotted.attention_groups
    assert slots.name == TOKEN_SLOTS and slots.window is None
    assert slots.flops(1000) == 0.0 and 0 < slots.kv_bytes_per_token < 8
    assert slotted.state_bytes == spec.state_bytes and slotted.state_bytes > 1000
    from jenga_sglang.policies.bundles import min_branch_tokens

    assert min_branch_tokens(slotted) == 0  # no KV: a 2-byte nominal slot must not gate it
    assert min_branch_tokens(replace(slotted, extra={})) > 1000
    hybrid = spec_from_hf_config(family_config("falcon_h1", 512))
    assert with_token_slots(hybrid) is hybrid
