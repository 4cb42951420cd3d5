"""Checked access to the fields of a Hugging Face `config.json` dict (framework-free).

Every field a spec builder reads goes through `Fields`: a missing or malformed one raises
`ConfigError` naming the architecture and the field. `shard` and `shard_or_replicate` split a
dimension over tensor-parallel ranks as SGLang 0.5.23 does, with the same errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from jenga_sglang.models.spec import DType


class ConfigError(ValueError):
    """A config.json that cannot be turned into a ModelSpec; the message names arch and field."""


class Fields:
    """Typed, checked access to one architecture's config fields."""

    def __init__(self, config: Mapping[str, object], arch: str) -> None:
        self.config = config
        self.arch = arch

    def error(self, field: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.arch}: field {field!r} {problem}")

    def has(self, name: str) -> bool:
        return self.config.get(name) is not None

    def get(self, *names: str) -> tuple[str, object]:
        """The first present field among `names` (aliases), as (name, value)."""
        for name in names:
            if self.has(name):
                return name, self.config[name]
        alias = f" (or {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else ""
        raise ConfigError(f"{self.arch}: missing field {names[0]!r}{alias}")

    def int(self, *names: str, minimum: int = 1) -> int:
        name, value = self.get(*names)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(name, f"must be an integer >= {minimum}, got {value!r}")
        return value

    def str_list(self, name: str, allowed: set[str]) -> list[str]:
        _, value = self.get(name)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(name, f"must be a list of strings, got {value!r}")
        bad = sorted(set(value) - allowed)
        if bad:
            raise self.error(name, f"has unknown entries {bad}; expected {sorted(allowed)}")
        return list(value)

    def dtype(self, *names: str) -> DType:
        name, value = self.get(*names)
        try:
            return DType.parse(str(value))
        except ValueError as exc:
            raise self.error(name, str(exc)) from None


@dataclass(frozen=True)
class Ctx:
    tp: int
    ssm_dtype: DType | None


@dataclass(frozen=True)
class Ssm:
    """Full-model dims of one Mamba2-like mixer, with the field names used in error messages."""

    d_inner: int
    n_heads: int
    head_dim: int
    n_groups: int
    d_state: int
    d_conv: int
    heads_field: str
    groups_field: str


def shard(f: Fields, field: str, total: int, tp: int) -> int:
    if total % tp:
        raise f.error(field, f"= {total} is not divisible by tp_size={tp}")
    return total // tp


def shard_or_replicate(f: Fields, field: str, total: int, tp: int) -> int:
    """Split over ranks; fewer than `tp` (dividing it) are replicated, one per rank."""
    if total < tp and tp % total == 0:
        return 1
    return shard(f, field, total, tp)
