"""Named model specs: Marconi's 7B formula model and real checkpoints shipped as config data.

Real presets are the few config.json fields our builders read, stored as package data in
`presets/<name>.json` (with a `_source` note saying where each value came from); nothing is
downloaded. `get_spec(name, tp_size)` builds the per-rank spec through `spec_from_hf_config`.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from jenga_sglang.models.config import spec_from_hf_config
from jenga_sglang.models.spec import AttentionGroup, DType, MambaGroup, MlpGroup, ModelSpec

MARCONI_7B = "marconi-7b"


def marconi_7b() -> ModelSpec:
    """The 7B hybrid of Marconi's reference, with its formulas exactly (per layer, l tokens).

    24 SSM, 4 attention, 28 MLP layers; d = 4096, n = 128, fp16.
    attention 8ld^2 + 4l^2d (l^2 pairs: the reference does not halve for causality), MLP 16ld^2,
    Mamba 12ld^2 + 16ldn + 10ld. KV 2*d*2 bytes per token per attention layer; SSM state
    d*n*2 + (2d + 2n)*4*2 bytes per layer, i.e. ~26.8 MB per checkpoint (~409 tokens of KV).
    The formula uses d, not Mamba2's inner width 2d: keep it for reproducing Marconi only.
    """
    d, n = 4096, 128
    heads = 32  # heads * head_dim = d: KV is 2*d values per token per layer
    return ModelSpec(
        name=MARCONI_7B,
        groups=(
            AttentionGroup(
                name="attention",
                num_layers=4,
                num_kv_heads=heads,
                head_dim=d // heads,
                dtype=DType.FP16,
                linear_flops_per_token=float(8 * d * d),
                score_flops_per_pair=float(4 * d),
                square_pairs=True,
            ),
            MambaGroup(
                name="mamba",
                num_layers=24,
                conv_shape=(2 * d + 2 * n, 4),
                conv_dtype=DType.FP16,
                temporal_shape=(d, n),
                temporal_dtype=DType.FP16,
                linear_flops_per_token=float(12 * d * d + 16 * d * n + 10 * d),
            ),
            MlpGroup(name="mlp", num_layers=28, linear_flops_per_token=float(16 * d * d)),
        ),
        hidden_size=d,
        source="Marconi (MLSys'25) reference 7B formulas",
    )


def _preset_files() -> dict[str, resources.abc.Traversable]:
    root = resources.files("jenga_sglang.models").joinpath("presets")
    return {p.name.removesuffix(".json"): p for p in root.iterdir() if p.name.endswith(".json")}


@cache
def _load_config(name: str) -> dict[str, object]:
    data = json.loads(_preset_files()[name].read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"preset {name!r}: expected a JSON object")
    return data


def preset_config(name: str) -> dict[str, object]:
    """A copy of a shipped preset's config fields (including its `_source` note)."""
    _check_known(name, real_only=True)
    return dict(_load_config(name))


def preset_names() -> list[str]:
    """Every preset name `get_spec` accepts."""
    return sorted([MARCONI_7B, *_preset_files()])


def get_spec(name: str, tp_size: int = 1) -> ModelSpec:
    """The ModelSpec of a named preset, per tensor-parallel rank."""
    _check_known(name, real_only=False)
    if name == MARCONI_7B:
        if tp_size != 1:
            raise ValueError(
                f"preset {MARCONI_7B!r} is a single-device formula; got tp_size={tp_size}"
            )
        return marconi_7b()
    config = {k: v for k, v in _load_config(name).items() if not k.startswith("_")}
    return spec_from_hf_config(config, tp_size=tp_size, name=name)


def _check_known(name: str, *, real_only: bool) -> None:
    known = sorted(_preset_files()) if real_only else preset_names()
    if name not in known:
        raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(known)}")
