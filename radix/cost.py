"""What a radix node is worth: FLOPs its own tokens save, bytes it holds (from the model spec).

The cost every `PrefixCache` scores hits with and hands to its eviction policy; it depends only
on the model spec and the tree's nodes, so it sits beside the `NodeCost` contract it fulfils."""

from __future__ import annotations

from collections.abc import Sequence

from mypy_extensions import mypyc_attr

from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.radix.contracts import NodeCost
from jenga_sglang.radix.node import Node


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class SpecNodeCost(NodeCost):
    """FLOPs saved by tokens [start, end) relative to the parent; bytes of KV pages and state.

    Attention's quadratic term makes deeper tokens more valuable: F(end) - F(start) counts
    the scores of those tokens against the whole prefix before them.

    F is memoised per length (`flops`): eviction policies re-rank nodes on every lock, unlock
    and insert, the cache scores every request's hit with it, and the same lengths recur.
    """

    def __init__(self, spec: ModelSpec, kv_page_bytes: Sequence[int], state_bytes: int) -> None:
        self.spec = spec
        self.kv_page_bytes = tuple(kv_page_bytes)
        self.state_bytes = state_bytes
        self._flops: dict[int, float] = {}

    def flops(self, length: int) -> float:
        """spec.flops(length), memoised."""
        f = self._flops.get(length)
        if f is None:
            f = self._flops[length] = self.spec.flops(length)
        return f

    def flops_saved(self, node: Node) -> float:
        # The same float arithmetic as spec.prefill_flops(start, end), from memoised terms.
        return self.flops(node.end) - self.flops(node.start)

    def bytes_held(self, node: Node) -> int:
        held = self.state_bytes * (len(node.inner) + (node.state is not None))
        for slot, page_bytes in enumerate(self.kv_page_bytes):  # not zip: see tree.py
            held += len(node.kv[slot]) * page_bytes
        return held
