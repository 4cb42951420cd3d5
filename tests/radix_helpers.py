"""Small specs and cache builders shared by the radix and policy tests."""

from __future__ import annotations

from jenga_sglang.models.spec import AttentionGroup, DType, MambaGroup, MlpGroup, ModelSpec
from jenga_sglang.policies.admission import SpeculativeAdmission
from jenga_sglang.policies.bundles import byte_budget
from jenga_sglang.policies.eviction import LruEviction
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.contracts import AdmissionPolicy, EvictionPolicy
from jenga_sglang.radix.memory import ByteBudget
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.tokens import TokenSeq

KV_TOKEN = 2 * 1 * 1 * 4 * 2  # K and V, 1 layer, 1 head, head_dim 4, fp16 = 16 bytes/token


def attention(window: int | None = None, name: str = "attn") -> AttentionGroup:
    return AttentionGroup(name, 1, 1, 4, DType.FP16, 10.0, 1.0, window=window)


def mamba() -> MambaGroup:
    # conv 4 x 2 fp16 = 16 bytes, temporal 4 x 4 fp32 = 64 bytes: one state = 80 bytes = 5 tokens
    return MambaGroup("ssm", 1, (4, 2), DType.FP16, (4, 4), DType.FP32, 20.0)


def hybrid_spec() -> ModelSpec:
    return ModelSpec("tiny-hybrid", (attention(), mamba(), MlpGroup("mlp", 1, 5.0)), hidden_size=4)


def attention_spec(window: int | None = None) -> ModelSpec:
    groups = (attention(), attention(window, "swa")) if window else (attention(),)
    return ModelSpec("tiny-attn", groups, hidden_size=4)


def make_cache(
    spec: ModelSpec,
    budget: int = 10**6,
    eviction: EvictionPolicy | None = None,
    admission: AdmissionPolicy | None = None,
) -> PrefixCache:
    return PrefixCache(
        spec,
        byte_budget(spec, budget),
        eviction or LruEviction(),
        admission or SpeculativeAdmission(),
    )


def memory(cache: PrefixCache) -> ByteBudget:
    assert isinstance(cache.memory, ByteBudget)
    return cache.memory


def toks(*ids: int) -> TokenSeq:
    return TokenSeq.of(list(ids))


def seq(start: int, n: int) -> TokenSeq:
    return TokenSeq.of(list(range(start, start + n)))


def node_at(cache: PrefixCache, *ids: int) -> Node:
    """The node where the tree's match of `ids` ends."""
    node = cache.tree.match(TokenSeq.of(list(ids))).node
    assert node is not None
    return node
