"""Admission policies: which SSM states a request leaves in the cache.

speculative (Marconi)
    Before prefill, a speculative insertion of the input finds where it leaves the tree (the
    branch point). If that point is not already a checkpointed node end, checkpoint the state
    exactly there during prefill: it is a prefix shared by at least two requests. After decoding,
    checkpoint the state after the last decoded token. At most two new states per request;
    with `prompt_end`, also the state at the end of the input (three).

every-block (vLLM+ style)
    A state every `block` tokens; only whole blocks are cached.

leaf-only
    Only the state after the last decoded token.
"""

from __future__ import annotations

from jenga_sglang.radix.contracts import AdmissionPolicy, Branch, CheckpointPlan


class SpeculativeAdmission(AdmissionPolicy):
    """Marconi's admission, optionally stricter about short branch points.

    With `min_branch_tokens` > 0, a branch shorter than that is checkpointed only where the tree
    already holds at least `short_branch_fanout` continuations (a node end with that many
    children): a chat template's opening tokens or a common first word are shared by almost
    every conversation, but a checkpoint there saves a handful of tokens per hit and costs a
    whole state (as much as 409 tokens of KV with marconi-7b), so it must be popular to pay off.

    With `prompt_end`, the state after the whole input is kept too. A served conversation's next
    prompt repeats this prompt but not always the reply as it was generated: chat templates
    re-render the reply (stripped reasoning, end-of-turn markers, re-tokenised text), so the
    state after the last decoded token may lie off the next prompt's path while the prompt end
    lies on it. When the next request does resume from the last decoded token, the prompt-end
    state is an ancestor nobody needs, which eviction can drop first.
    """

    def __init__(
        self,
        max_states: int = 2,
        min_branch_tokens: int = 0,
        short_branch_fanout: int = 2,
        prompt_end: bool = False,
        on_sequence: bool = False,
    ) -> None:
        if max_states < 1:
            raise ValueError(f"max_states must be >= 1, got {max_states}")
        if min_branch_tokens < 0 or short_branch_fanout < 1:
            raise ValueError(
                f"need min_branch_tokens >= 0 and short_branch_fanout >= 1, got "
                f"{min_branch_tokens}, {short_branch_fanout}"
            )
        self.max_states = max_states
        self.min_branch_tokens = min_branch_tokens
        self.short_branch_fanout = short_branch_fanout
        self.prompt_end = prompt_end
        self.plans_on_sequence = on_sequence

    def plan(self, branch: Branch, input_len: int, total_len: int, hit_len: int) -> CheckpointPlan:
        prefill: tuple[int, ...] = ()
        finish: tuple[int, ...] = (total_len,)
        reach = total_len if self.plans_on_sequence else input_len
        if self._wants(branch) and hit_len < branch.length <= reach and self.max_states >= 2:
            if branch.length <= input_len:
                prefill = (branch.length,)
            elif branch.length < total_len:
                finish = (branch.length, total_len)
        if self._wants_prompt_end(branch, input_len, total_len, hit_len, prefill):
            prefill += (input_len,)
        return CheckpointPlan(prefill_at=prefill, finish_at=finish, cache_len=total_len)

    def _wants_prompt_end(
        self, branch: Branch, input_len: int, total_len: int, hit_len: int, planned: tuple[int, ...]
    ) -> bool:
        if not self.prompt_end or not hit_len < input_len < total_len or input_len in planned:
            return False
        return not (branch.length == input_len and branch.checkpointed)

    def _wants(self, branch: Branch) -> bool:
        if branch.length == 0 or branch.checkpointed:
            return False
        if branch.length >= self.min_branch_tokens:
            return True
        return branch.at_node_end and branch.fanout >= self.short_branch_fanout


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
