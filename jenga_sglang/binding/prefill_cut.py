"""End a prefill chunk exactly at the branch point our admission planned.

With the `no_buffer` Mamba strategy the live SSM state is exact only where a prefill chunk
ends, and SGLang's `PrefillAdder` shapes chunks by token budget alone. These two AROUND hooks
(registered through SGLang's HookRegistry by the plugin) shorten the chunk that would run past
`req.mamba_branching_seqlen`, so the scheduler's next `checkpoint` sees `up_to == branch` and
the backend forks the state there:

    prefix_len ........ branch ........ extend_end          (before)
    |-- this chunk -------|                                 (after: the rest is the next chunk)

Why the hooks also end the round (`rem_chunk_tokens = 0`): SGLang tracks one chunked request at
a time (`Scheduler.chunked_req`, asserted when the adder names a new one). A chunk SGLang cuts
itself always exhausts the round's token budget, so nothing else is added after it; a cut made
here leaves budget over, and a second request truncated later in the round would replace this
one as the chunked request. The token budget stays charged for the uncut chunk (conservative).

Only requests served by a `JengaRadixCache` are touched, and only when SGLang could chunk them
(chunked prefill enabled, no other chunked request in flight).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ADDER = "sglang.srt.managers.schedule_policy.PrefillAdder"


def _cut_position(adder: Any, req: Any) -> int | None:
    """The branch point inside the chunk just added, if the chunk must end there."""
    from jenga_sglang.binding.backend import JengaRadixCache

    if not isinstance(adder.tree_cache, JengaRadixCache) or adder.rem_chunk_tokens is None:
        return None
    if req not in adder.can_run_list:
        return None  # not admitted this round
    branch = req.mamba_branching_seqlen
    if branch is None or not req.prefix_len < branch < req.extend_end:
        return None
    return int(branch)


def around_add_one_req(
    original: Callable[..., Any], adder: Any, req: Any, *a: Any, **k: Any
) -> Any:
    has_chunked_req = bool(a[0] if a else k.get("has_chunked_req", False))
    result = original(adder, req, *a, **k)
    branch = _cut_position(adder, req)
    if branch is None or has_chunked_req or adder.new_chunked_req not in (None, req):
        return result
    req.extend_end = branch
    adder.new_chunked_req = req
    adder.rem_chunk_tokens = 0
    return adder.budget_state()


def around_add_chunked_req(original: Callable[..., Any], adder: Any, req: Any) -> Any:
    result = original(adder, req)
    branch = _cut_position(adder, req)
    if branch is None:
        return result
    req.extend_end = branch
    adder.rem_chunk_tokens = 0
    return req  # still chunked: the scheduler keeps it as its chunked request
