"""What the tensor-parallel ranks of one cache agree on, and SGLang's rank-consensus checker.

Every TP rank runs its own scheduler, pools and `JengaRadixCache` over its shard, on the same
request stream. The ranks stay in lockstep only if they make the same cache decisions, because
the scheduler's batches (and so every collective of the forward) follow from them. Our tree and
policies are deterministic given the same calls (a logical clock, no randomness, no wall time);
the facts that could still differ per rank are agreed before anything depends on them:

* the Jenga pool's byte budget: the MIN over the group before the pool is built, and then the
  built pools' geometry (large pages, page sizes, reserve, room per type) must be equal on every
  rank, or start-up fails naming both values (`agree_pool_budget`, `check_pool_agreed`);
* the alpha tuner's outcome: only group rank 0 replays and broadcasts (binding/cache/tp_share.py).

With ``SGLANG_ENABLE_RANK_CONSENSUS_CHECKER=1`` SGLang compares, in a background thread over a
gloo group of its own, every decision its own caches mark with `rank_consensus`. The factory
then builds `ConsensusJengaRadixCache`: the same cache with SGLang's marks on the calls that
change or read the tree (`match_prefix`, `insert`, `evict`, `checkpoint`, `on_release`, and a
host hit's `init_load_back`), each also comparing what the tree holds afterwards (the host
tier's bytes included), and on the in-pass capture plan of each batch.
A rank that diverges stops the server (SGLang's checker exits the scheduler process).
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from sglang.srt.utils.rank_consensus_checker import assert_same, rank_consensus

from jenga_sglang.binding.cache.backend import JengaRadixCache
from jenga_sglang.binding.cache.captures import BatchCaptures

CHECKER_ENV = "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"
_F = TypeVar("_F", bound=Callable[..., Any])
_CAPTURES = "None if result is None else [(c.row, c.offset, c.slot) for c in result.captures]"


def _mark(**selectors: Any) -> Callable[[_F], _F]:
    """SGLang's `rank_consensus` mark, typed (a no-op unless the checker's variable is set)."""
    return cast(Callable[[_F], _F], rank_consensus(**selectors))


def checker_requested() -> bool:
    """Whether SGLang's checker is on in this process (it reads the variable at import)."""
    return os.environ.get(CHECKER_ENV, "").lower() in ("1", "true", "yes")


_SGLANG_GROUP = object()  # "the group SGLang's caches agree over"


def _tp_cpu_group(group: Any = _SGLANG_GROUP) -> Any | None:
    """`group`, by default the gloo group SGLang's caches agree over
    (`CacheInitParams.tp_cache_group`); None outside a distributed run or with one rank."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    if group is _SGLANG_GROUP:
        from sglang.srt.layers.dp_attention import get_dp_tp_group

        group = get_dp_tp_group().cpu_group
    return group if group is not None and dist.get_world_size(group) > 1 else None


def _reduce(values: list[int], op: Any, group: Any) -> list[int]:
    tensor = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(tensor, op=op, group=group)
    return [int(v) for v in tensor.tolist()]


def agree_pool_budget(budget_bytes: int, group: Any = _SGLANG_GROUP) -> int:
    """The smallest byte budget of any rank: every rank builds the same pool from it."""
    group = _tp_cpu_group(group)
    if group is None:
        return budget_bytes
    return _reduce([budget_bytes], dist.ReduceOp.MIN, group)[0]


def pool_facts(shared: Any) -> dict[str, int]:
    """The figures of a built `SharedJengaPool` that every rank must share."""
    pool = shared.pool
    return {
        "large pages": int(pool.num_large),
        "large page bytes": int(pool.geometry.large_page_bytes),
        "state reserve": int(shared.state_reserve),
        "KV room": int(shared.room(shared.kv_type)),
        "state room": int(shared.room(shared.state_type)),
        **{f"page bytes of type {i}": int(t.page_bytes) for i, t in enumerate(pool.geometry.types)},
    }


def check_pool_agreed(shared: Any, group: Any = _SGLANG_GROUP) -> None:
    """Start-up error when the ranks built pools of different geometry (names the figure)."""
    group = _tp_cpu_group(group)
    if group is None:
        return
    facts = pool_facts(shared)
    values = list(facts.values())
    low = _reduce(values, dist.ReduceOp.MIN, group)
    high = _reduce(values, dist.ReduceOp.MAX, group)
    for name, lo, hi in zip(facts, low, high, strict=True):
        if lo != hi:
            raise RuntimeError(
                f"--enable-jenga with tensor parallelism: the ranks' Jenga pools differ in "
                f"{name} ({lo} on one rank, {hi} on another); every rank must make the same "
                f"cache decisions, so the pools must be equal"
            )


class ConsensusJengaRadixCache(JengaRadixCache):
    """`JengaRadixCache` with SGLang's rank-consensus marks (module doc)."""

    @staticmethod
    def tokens_digest(key: Any) -> str | None:
        """A short digest of a key's token ids: ranks must agree on content, not only length."""
        if key is None:
            return None
        packed = array("q", key.token_ids).tobytes()  # the key as SGLang holds it, packed
        return hashlib.blake2b(packed, digest_size=8).hexdigest()

    def _held(self) -> tuple[int, int, int, int, int]:
        """What the tree holds: evictable and protected KV tokens, evictable and used states,
        and the host tier's bytes (`--jenga-host-gb`; 0 without it)."""
        slots = self.slots
        return (
            slots.evictable_tokens(),
            slots.protected_tokens(),
            slots.states("evictable") if self.state_type is not None else 0,
            slots.states("used") if self.state_type is not None else 0,
            0 if self.host is None else self.host.memory.held_bytes(),
        )

    def _agree_held(self, call: str) -> None:
        assert_same("jenga tree after %s holds %s", call, self._held())

    @_mark(
        same_params=[
            "len(params.key)",
            "params.cow_mamba",
            "None if params.req is None else params.req.rid",
        ],
        same_results=[
            "result.device_prefix_len",
            "result.mamba_branching_seqlen",
            "result.full_kv_hit_length",
            "result.host_hit_length",
            "result.mamba_host_hit_length",
            "result.swa_host_hit_length",
        ],
    )
    def match_prefix(self, params: Any) -> Any:
        result = super().match_prefix(params)
        rid = getattr(params.req, "rid", None)
        if rid is not None:
            assert_same("jenga plan of %s: %s", rid, self.plans.get(rid).positions)
        self._agree_held("match_prefix")
        return result

    @_mark(
        same_params=["self.tokens_digest(params.key)"],
        same_results=["result.prefix_len", "result.mamba_exist"],
    )
    def insert(self, params: Any) -> Any:
        result = super().insert(params)
        self._agree_held("insert")
        return result

    @_mark(
        same_params=["None if params.req is None else params.req.rid", "params.host_hit_length"],
        same_results=["None if result is None else result[0]"],
    )
    def init_load_back(self, params: Any) -> Any:
        result = super().init_load_back(params)
        self._agree_held("init_load_back")
        return result

    @_mark(same_params=True, same_results=True)
    def evict(self, params: Any) -> Any:
        result = super().evict(params)
        self._agree_held("evict")
        return result

    @_mark(same_params=["req.rid", "up_to"])
    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        super().checkpoint(req, up_to=up_to, **kwargs)
        self._agree_held("checkpoint")

    @_mark(same_params=["req.rid", "checkpointed"])
    def on_release(self, req: Any, *, checkpointed: bool) -> None:
        super().on_release(req, checkpointed=checkpointed)
        self._agree_held("on_release")

    @_mark(same_results=[_CAPTURES])
    def plan_captures(self, reqs: list[Any]) -> BatchCaptures | None:
        return super().plan_captures(reqs)
