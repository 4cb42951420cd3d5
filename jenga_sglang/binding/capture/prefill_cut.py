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

With `extra_buffer` the state is not read from the live slot but from the ping-pong slot SGLang
tracks during the chunk (`ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend`): the
last multiple of the Mamba chunk `G` (64) counted from the chunk's start, or the branch point
itself when it lies on that grid and inside the chunk. A chunk ending at an off-grid branch
tracks an earlier position, so the cut differs (`extra_buffer_cut`): it ends the chunk at the
last position q <= branch - G with q = branch (mod G), so that the next chunk starts on the
branch's grid and SGLang tracks the branch in it; the backend then takes that ping-pong slot
(mamba_state):

    prefix_len .... q ........ branch ........ extend_end   (q = branch - k*G, k >= 1)
    |-- this chunk -|-- next chunk: SGLang tracks branch --|

No cut is needed when the branch is on the grid and inside the chunk. Never trackable: a branch
fewer than G tokens past the chunk start when off its grid. The prompt end is realigned only
in a chunk that does not reach it (that chunk ended anyway); in the last chunk a cut would add
a round, which the no_buffer strategy does not pay for the prompt end.

Only requests served by a `JengaRadixCache` are touched, and only when SGLang could chunk them
(chunked prefill enabled, no other chunked request in flight).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jenga_sglang.binding.capture.shared_prefill import give_back_staged_state, should_wait

ADDER = "sglang.srt.managers.schedule_policy.PrefillAdder"


def _cut_position(adder: Any, req: Any) -> int | None:
    """Where the chunk just added must end (`cut_position`), if it is ours to cut."""
    from jenga_sglang.binding.cache.backend import JengaRadixCache

    cache = adder.tree_cache
    if not isinstance(cache, JengaRadixCache) or adder.rem_chunk_tokens is None:
        return None
    if cache.captures is not None:
        return None  # the forward captures the planned states in-pass: nothing to cut
    if req not in adder.can_run_list:
        return None  # not admitted this round
    return cut_position(cache, req)


def cut_position(cache: Any, req: Any) -> int | None:
    """Where the chunk [req.prefix_len, req.extend_end) must end for `cache` to capture the
    state at `req.mamba_branching_seqlen` exactly, or None (no cut)."""
    branch = req.mamba_branching_seqlen
    if branch is None:
        return None
    start, end = int(req.prefix_len), int(req.extend_end)
    if cache.handover is not None and cache.handover.extra_buffer:
        from sglang.srt.runtime_context import mamba_cache_chunk_size

        input_len = len(req.full_untruncated_fill_ids)
        if branch == input_len == end:
            return None  # the last chunk: see the module doc
        return extra_buffer_cut(start, end, int(branch), mamba_cache_chunk_size())
    return int(branch) if start < branch < end else None


def extra_buffer_cut(start: int, end: int, branch: int, grid: int) -> int | None:
    """The end for chunk [start, end) after which SGLang's tracking reaches `branch` (module
    doc), or None when the chunk needs no cut or no cut helps."""
    if branch <= start:
        return None
    off = (branch - start) % grid
    if off == 0:
        if end >= branch:
            return None  # tracked in this chunk
        cut = start + (end - start) // grid * grid  # keep the next chunk on the grid
    else:
        last = min(end, branch - grid)  # the next chunk must span >= grid tokens to track
        if last < start + off:
            return None
        cut = start + off + (last - start - off) // grid * grid
    return cut if start < cut < end else None


def around_add_one_req(
    original: Callable[..., Any], adder: Any, req: Any, *a: Any, **k: Any
) -> Any:
    cache = adder.tree_cache
    if should_wait(cache, req, adder.can_run_list):  # binding/capture/shared_prefill.py
        give_back_staged_state(cache, req)
        cache.held_back += 1
        from sglang.srt.managers.schedule_policy import AddReqResult

        return AddReqResult.CONTINUE  # still waiting; the scheduler goes on with the next
    has_chunked_req = bool(a[0] if a else k.get("has_chunked_req", False))
    result = original(adder, req, *a, **k)
    cut = _cut_position(adder, req)
    if cut is None or has_chunked_req or adder.new_chunked_req not in (None, req):
        return result
    req.extend_end = cut
    adder.new_chunked_req = req
    adder.rem_chunk_tokens = 0
    adder.tree_cache.prefill_cuts += 1
    return adder.budget_state()


def around_add_chunked_req(original: Callable[..., Any], adder: Any, req: Any) -> Any:
    result = original(adder, req)
    cut = _cut_position(adder, req)
    if cut is None:
        return result
    req.extend_end = cut
    adder.rem_chunk_tokens = 0
    adder.tree_cache.prefill_cuts += 1
    return req  # still chunked: the scheduler keeps it as its chunked request
