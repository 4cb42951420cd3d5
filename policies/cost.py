"""What a radix node is worth: FLOPs its own tokens save, bytes it holds (from the model spec)."""

from __future__ import annotations

from collections.abc import Sequence

from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.base import NodeCost
from jenga_sglang.radix.node import Node


class SpecNodeCost(NodeCost):
    """FLOPs saved by tokens [start, end) relative to the parent; bytes of KV pages and state.

    Attention's quadratic term makes deeper tokens more valuable: F(end) - F(start) counts
    the scores of those tokens against the whole prefix before them.
    """

    def __init__(self, spec: ModelSpec, kv_page_bytes: Sequence[int], state_bytes: int) -> None:
        self.spec = spec
        self.kv_page_bytes = tuple(kv_page_bytes)
        self.state_bytes = state_bytes

    def flops_saved(self, node: Node) -> float:
        return self.spec.prefill_flops(node.start, node.end)

    def bytes_held(self, node: Node) -> int:
        held = sum(len(p) * b for p, b in zip(node.kv, self.kv_page_bytes, strict=True))
        return held + (self.state_bytes if node.state is not None else 0)
