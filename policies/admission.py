"""Admission policies: which SSM states a request leaves in the cache.

speculative (Marconi)
    Before prefill, a speculative insertion of the input finds where it leaves the tree (the
    branch point). If that point is not already a checkpointed node end, checkpoint the state
    exactly there during prefill: it is a prefix shared by at least two requests. After decoding,
    checkpoint the state after the last decoded token. At most two new states per request.

every-block (vLLM+ style)
    A state every `block` tokens; only whole blocks are cached.

leaf-only
    Only the state after the last decoded token.
"""

from __future__ import annotations

from jenga_sglang.policies.base import AdmissionPolicy, Branch, CheckpointPlan


class SpeculativeAdmission(AdmissionPolicy):
    """Marconi's admission; `min_branch_tokens` > 0 skips branch points shorter than that.

    A checkpoint at a short shared prefix (a chat template's opening tokens, a common first
    word) saves a handful of tokens per hit but costs a whole state: with marconi-7b one state
    weighs as much as 409 tokens of KV. `jenga` sets the bound from the model spec.
    """

    def __init__(self, max_states: int = 2, min_branch_tokens: int = 0) -> None:
        if max_states < 1:
            raise ValueError(f"max_states must be >= 1, got {max_states}")
        if min_branch_tokens < 0:
            raise ValueError(f"min_branch_tokens must be >= 0, got {min_branch_tokens}")
        self.max_states = max_states
        self.min_branch_tokens = min_branch_tokens

    def plan(self, branch: Branch, input_len: int, total_len: int, hit_len: int) -> CheckpointPlan:
        prefill: tuple[int, ...] = ()
        long_enough = branch.length >= max(1, self.min_branch_tokens)
        wants_branch = long_enough and not branch.checkpointed
        if wants_branch and hit_len < branch.length <= input_len and self.max_states >= 2:
            prefill = (branch.length,)
        return CheckpointPlan(prefill_at=prefill, finish_at=(total_len,), cache_len=total_len)


class EveryBlockAdmission(AdmissionPolicy):
    def __init__(self, block: int = 32) -> None:
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self.block = block

    def plan(self, branch: Branch, input_len: int, total_len: int, hit_len: int) -> CheckpointPlan:
        cache_len = total_len - total_len % self.block
        first = (hit_len // self.block + 1) * self.block
        at = tuple(range(first, cache_len + 1, self.block))
        prefill = tuple(p for p in at if p <= input_len)
        finish = tuple(p for p in at if p > input_len)
        return CheckpointPlan(prefill_at=prefill, finish_at=finish, cache_len=cache_len)


class LeafOnlyAdmission(AdmissionPolicy):
    def plan(self, branch: Branch, input_len: int, total_len: int, hit_len: int) -> CheckpointPlan:
        return CheckpointPlan(finish_at=(total_len,), cache_len=total_len)
