"""The alpha tuner's outcome shared over SGLang's TP group (policies/background.py `ShareChannel`).

Every rank of a tensor-parallel group runs its own cache on the same request stream. Their
tuning replays are deterministic, but a worker process can still die on one rank only; then
that rank would keep its old alpha and its tree would drift from the others. So only group
rank 0 replays, and at the due request it broadcasts what it got over the group's CPU (gloo)
process group: `CacheInitParams.tp_cache_group`, the group SGLang's own caches use to agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.distributed as dist

if TYPE_CHECKING:
    from jenga_sglang.policies.replay_grid import Scores


class TuningFailedOnLeader(RuntimeError):
    """The leader's replay failed; sent to the followers in place of the original exception,
    which may not unpickle on another rank."""


class GroupShare:
    """A `ShareChannel` over a torch.distributed process group (group rank 0 leads)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self._source = dist.get_global_rank(group, 0)
        self._leader = dist.get_rank(group) == 0

    @property
    def leader(self) -> bool:
        return self._leader

    def share(self, outcome: Scores | Exception | None) -> Scores | Exception:
        if self._leader and outcome is None:  # a bug; still broadcast, or the others hang
            outcome = RuntimeError("the leader had no tuning outcome to share")
        payload: list[object] = [_wire(outcome) if self._leader else None]
        dist.broadcast_object_list(payload, src=self._source, group=self.group)
        if self._leader:
            assert outcome is not None
            return outcome
        received = payload[0]
        if isinstance(received, str):
            return TuningFailedOnLeader(received)
        return received  # type: ignore[return-value]  # Scores, as the leader sent them


def _wire(outcome: Scores | Exception | None) -> object:
    """Scores travel as they are; a failure travels as its description."""
    if isinstance(outcome, Exception):
        return f"{type(outcome).__name__}: {outcome}"
    return outcome


def share_channel(group: Any) -> GroupShare | None:
    """A channel when there is a group of more than one rank to agree with."""
    if group is None or not dist.is_available() or not dist.is_initialized():
        return None
    return GroupShare(group) if dist.get_world_size(group) > 1 else None
