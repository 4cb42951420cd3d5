"""The host tier's policy: what device eviction moves to host memory, what a hit loads back,
what host memory drops; FLOP-aware across both tiers (docs/host-tier.md).

Every decision weighs the same two times: loading an entry's bytes over the host link
(`bandwidth` bytes/s) against recomputing what it saves (`flop_rate` FLOP/s: the cost model's
peak x MFU). What an entry saves is what the next hit through it would otherwise recompute:

* a checkpoint at p saves [a, p), a being the nearest checkpoint above it (either tier): without
  it that hit falls back to a. An SSM checkpoint saves its whole prefix back to there;
* a node's KV saves its own tokens, F(end) - F(start): a KV page saves one token's attention
  (deeper tokens more, attention's quadratic term). With a Mamba group KV with no checkpoint
  at or below it serves no hit and saves nothing;
* a leaf moving whole (KV and checkpoint) saves [a, end) in a Mamba model, its own tokens in
  an attention-only one.

* `FlopAwareTier.demotes`: a device victim moves to host when the recompute it saves,
  weighted by the chance its device policy gives it of being hit again
  (`EvictionPolicy.reuse_odds`), takes longer than its load; or when it has host children
  (dropping it would drop them: it is their prefix) and the device policy does not expect it
  dead. A superseded checkpoint's chance is the share of such states the workload resumed
  from again (policies/superseded.py): on chats (ShareGPT) a few per thousand, so they are
  dropped; where requests do come back to them, more, and they go to host;
* `FlopAwareTier.loads`: a host hit is loaded when the time to first token with the load
  (overlapped with prefill layer by layer, `overlapped_seconds`) beats recomputing from the
  device hit;
* `HostEviction`: host entries ranked by Marconi's utility over recency and recompute FLOPs
  saved per host byte, with the device policy's current (tuned) alpha; LRU when it is 0.
"""

from __future__ import annotations

from typing import NamedTuple

from mypy_extensions import mypyc_attr

from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.eviction import FlopAwareEviction
from jenga_sglang.radix.contracts import EvictionPolicy, NodeCost, TierPolicy
from jenga_sglang.radix.cost import SpecNodeCost
from jenga_sglang.radix.memory import CacheMemory
from jenga_sglang.radix.node import Node

#: PCIe 4 x16 host-device bandwidth, bytes/s (PCIe 5: about twice)
DEFAULT_BANDWIDTH = 25e9


class HostSpec(NamedTuple):
    """A host tier to build: its memory, the link's bandwidth, the compute rate it is weighed
    against (the cost model's peak FLOP/s x MFU)."""

    memory: CacheMemory
    bandwidth: float
    flop_rate: float


def tier_layers(spec: ModelSpec) -> int:
    """Layers that hold KV or a state: the stages a layer-by-layer load overlaps."""
    layers = sum(g.num_layers for g in spec.attention_groups)
    return max(1, layers + sum(g.num_layers for g in spec.mamba_groups))


def overlapped_seconds(load_s: float, compute_s: float, layers: int) -> float:
    """Prefill of `compute_s` seconds that needs `load_s` seconds of loads first, both split
    evenly over `layers` layers: loads run one after another on the copy stream, each layer's
    compute waits for its load and for the layer before it. A two-stage pipeline:
    l + c + (layers - 1) * max(l, c) with l, c the per-layer times; the compute alone without
    a load."""
    if load_s <= 0:
        return compute_s
    per_load, per_compute = load_s / layers, compute_s / layers
    return per_load + per_compute + (layers - 1) * max(per_load, per_compute)


def fallback(node: Node) -> int:
    """Where a hit falls back to without `node`'s checkpoint: the end of the nearest node
    above it holding one (either tier), 0 at the root. O(depth)."""
    above = node.parent
    while above is not None and above.parent is not None:
        if above.state is not None or above.host_state is not None:
            return above.end
        above = above.parent
    return 0


def entry_value(cost: SpecNodeCost, node: Node, state_only: bool) -> tuple[float, int]:
    """(FLOPs the entry saves a later hit, bytes it holds): `node`'s checkpoint alone with
    `state_only`, else the node whole (module docstring)."""
    flops = cost.flops
    if state_only:
        return flops(node.end) - flops(fallback(node)), cost.state_bytes
    kv = 0
    for slot, page_bytes in enumerate(cost.kv_page_bytes):  # not zip: see radix/tree.py
        kv += len(node.kv[slot]) * page_bytes
    checkpointed = node.state is not None or node.host_state is not None
    held = kv + cost.state_bytes * checkpointed
    if not cost.state_bytes:  # attention only: a hit anywhere, its own tokens
        return flops(node.end) - flops(node.start), held
    if checkpointed:
        return flops(node.end) - flops(fallback(node)), held
    if node.host_children:  # KV the hits on its host descendants read
        return flops(node.end) - flops(node.start), held
    return 0.0, held


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class HostEviction(FlopAwareEviction):
    """Ranks host entries: host leaves (whole) and host checkpoints of other nodes, by
    recency and recompute FLOPs saved per host byte, weighted by the device policy's alpha.
    Entries held by a transfer (lock_ref > 0, radix/host_load.py) are not candidates."""

    def __init__(self, device: EvictionPolicy) -> None:
        super().__init__(device.alpha)
        self.device = device
        self._spec_cost: SpecNodeCost | None = None

    @staticmethod
    def is_candidate(node: Node) -> bool:
        if node.lock_ref or node.parent is None:
            return False
        if node.host and not node.host_children:
            return True
        return node.host_state is not None

    def update(self, node: Node) -> None:
        # Here, not inherited: compiled (scripts/build_compiled.py), the base class's update
        # calls its own static is_candidate, never an interpreted subclass's.
        if self.is_candidate(node):
            self._rank(node)
        else:
            self._discard(node)

    def bind_cost(self, node_flops: NodeCost) -> None:
        super().bind_cost(node_flops)
        self._spec_cost = _spec_cost(node_flops)

    def efficiency(self, node: Node) -> float:
        assert self._spec_cost is not None, "HostEviction needs bind_cost() before use"
        whole = node.host and not node.host_children
        flops, held = entry_value(self._spec_cost, node, not whole)
        return flops / max(1, held)

    def victim(self) -> Node | None:
        self.alpha = self.device.alpha  # one FLOP weight for both tiers (tuned on the device)
        return super().victim()


@mypyc_attr(allow_interpreted_subclasses=True, serializable=True)
class FlopAwareTier(TierPolicy):
    """Demote what loads faster than its recompute, weighted by its odds of a hit; load a host
    hit when that makes the first token sooner; rank host entries with `HostEviction`."""

    def __init__(
        self, device: EvictionPolicy, bandwidth: float, flop_rate: float, layers: int
    ) -> None:
        if not (bandwidth > 0 and flop_rate > 0 and layers > 0):
            raise ValueError(
                f"host tier needs a positive bandwidth, FLOP rate and layer count, got "
                f"{bandwidth}, {flop_rate}, {layers}"
            )
        self.device = device
        self.host = HostEviction(device)
        self.bandwidth = bandwidth
        self.flop_rate = flop_rate
        self.layers = layers
        self._cost: SpecNodeCost | None = None

    def bind_cost(self, node_flops: NodeCost) -> None:
        self._cost = _spec_cost(node_flops)
        self.host.bind_cost(node_flops)

    def demotes(self, node: Node, state_only: bool) -> bool:
        odds = self.device.reuse_odds(node)
        if odds <= 0:
            return False
        if not state_only and node.host_children:
            return True  # dropping it would drop the host entries below it, whose prefix it is
        assert self._cost is not None, "FlopAwareTier needs bind_cost() before use"
        flops, held = entry_value(self._cost, node, state_only)
        return odds * flops / self.flop_rate > held / self.bandwidth

    def loads(self, load_bytes: int, flops_after: float, flops_without: float) -> bool:
        loaded = overlapped_seconds(
            load_bytes / self.bandwidth, flops_after / self.flop_rate, self.layers
        )
        return loaded < flops_without / self.flop_rate


def _spec_cost(node_flops: NodeCost) -> SpecNodeCost:
    if not isinstance(node_flops, SpecNodeCost):
        raise TypeError(f"the host tier weighs a model spec's costs, got {type(node_flops)}")
    return node_flops
