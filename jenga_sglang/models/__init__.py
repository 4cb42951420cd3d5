"""Framework-free model specs: layer groups, bytes per token / per state, prefill FLOPs."""

from jenga_sglang.models import families as families  # registers its builders
from jenga_sglang.models.config import spec_from_hf_config, supported_architectures
from jenga_sglang.models.hf_fields import ConfigError
from jenga_sglang.models.presets import get_spec, marconi_7b, preset_config, preset_names
from jenga_sglang.models.spec import (
    AttentionGroup,
    DType,
    LayerGroup,
    MambaGroup,
    MlpGroup,
    ModelSpec,
)

__all__ = [
    "AttentionGroup",
    "ConfigError",
    "DType",
    "LayerGroup",
    "MambaGroup",
    "MlpGroup",
    "ModelSpec",
    "get_spec",
    "marconi_7b",
    "preset_config",
    "preset_names",
    "spec_from_hf_config",
    "supported_architectures",
]
