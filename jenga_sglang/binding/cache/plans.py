"""What our admission planned for each request, kept from match_prefix to its last checkpoint.

SGLang matches a request each round it may schedule it (`match_prefix`), then calls
`checkpoint` after prefill chunks and when the request finishes. The plan made at the match
says where states are captured on the way (`positions`, handed to SGLang one at a time as
`mamba_branching_seqlen`), what of the finished sequence is expendable (`expendable_from`,
see `CheckpointPlan`), and which hit to count once the request is taken (`found`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from jenga_sglang.radix.contracts import CheckpointPlan
from jenga_sglang.radix.match import MatchResult as TreeMatch
from jenga_sglang.radix.tokens import TokenSeq

#: Far more requests than a scheduler holds queued and running at once.
MAX_PLANS = 16_384


class Planned(NamedTuple):
    positions: tuple[int, ...] = ()  # prefill positions past the hit, ascending
    expendable_from: int | None = None
    # The request's token ids as the match packed them (its fill ids then): later checkpoints
    # of the request take their prefix without packing a long prompt again. Fill ids only grow
    # at the end (outputs), so the prefix stays the request's.
    tokens: TokenSeq | None = None
    namespace: str | None = None  # the request's (binding/cache/namespaces.py)
    # The match to count as the request's hit once SGLang takes it (backend.py `_taken`);
    # None once counted
    found: TreeMatch | None = None

    def tokens_up_to(self, n: int, ids: Sequence[int]) -> TokenSeq:
        """The request's first `n` tokens: the packed ones when they reach n, else `ids`."""
        if self.tokens is not None and n <= len(self.tokens):
            return self.tokens.truncated(n)
        return TokenSeq.of(ids[:n])

    @classmethod
    def of(cls, plan: CheckpointPlan, hit: int, input_len: int) -> Planned:
        """The part of `plan` SGLang acts on for a request that hit `hit` tokens."""
        positions = tuple(sorted(p for p in plan.prefill_at if hit < p <= input_len))
        return cls(positions, plan.expendable_from)


NOTHING = Planned()


class RequestPlans:
    """Plans by request id. A request aborted while queued may never reach its last
    checkpoint or its release, so the oldest plans beyond `limit` are dropped."""

    def __init__(self, limit: int = MAX_PLANS) -> None:
        self.limit = limit
        self._plans: dict[str, Planned] = {}
        # Requests with a plan in a named namespace (capture/shared_prefill.py reads it); empty, and
        # never touched, while no request has a namespace.
        self.namespaced: set[str] = set()

    def remember(self, rid: str, planned: Planned) -> None:
        self._plans.pop(rid, None)  # re-matched: the newest plan goes to the back
        self._plans[rid] = planned
        if planned.namespace is not None:
            self.namespaced.add(rid)
        elif self.namespaced:
            self.namespaced.discard(rid)
        if len(self._plans) > self.limit:
            self.pop(next(iter(self._plans)))

    def get(self, rid: str) -> Planned:
        return self._plans.get(rid, NOTHING)

    def pop(self, rid: str) -> Planned:
        if self.namespaced:
            self.namespaced.discard(rid)
        return self._plans.pop(rid, NOTHING)

    def __len__(self) -> int:
        return len(self._plans)

    def __contains__(self, rid: object) -> bool:
        return rid in self._plans


def key_tokens(params_key: Any, whole: TokenSeq | None = None) -> TokenSeq | None:
    """An SGLang match or insert key's tokens packed (`whole`: its token_ids, already packed);
    None for an empty key. Its namespace: binding/cache/namespaces.py `key_namespace`."""
    if len(params_key) == 0:
        return None
    if whole is not None:
        return whole.truncated(len(params_key))  # shares the bytes: no copy
    return TokenSeq.of(params_key.token_ids[: len(params_key)])


def will_decode(req: Any) -> bool:
    """Whether the request decodes after its prefill. Its final length is unknown until it
    finishes, so the plan is made for input + 1 tokens: it learns only that decoding follows
    (a prompt-end state is then worth keeping)."""
    if req is None:
        return False  # a probe match: nothing will be prefilled
    budget = getattr(getattr(req, "sampling_params", None), "max_new_tokens", None)
    return budget is None or int(budget) > 0
