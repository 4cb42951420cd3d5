"""Do not prefill one uncached prefix twice in a round: wait for its in-pass checkpoint instead.

Several waiting requests often leave the cached tree at the same point: a shared system
prompt, the first turns of forked programs. Each one's plan then holds the same branch point p,
and a round that admits them all prefills [hit, p) once per request, because none of their
checkpoints exists before the round's forward. When a request admitted earlier in this round
computes p and captures its state there (in-pass, binding/captures.py), a later request whose
own plan names the same p on the same tokens is held back one round: next round it hits p.

    round k:   A: hit ... p ....... end          (captures the state at p)
               B: hit ... p ... end              held back: [hit, p) would be computed twice
    round k+1: B:         p ... end              hits p

Held back only for a p short of the request's own end, and only when that saves at least half
of the request's uncached tokens (and at least `MIN_SAVED` tokens): one round of waiting then
buys a shorter prefill for it and a smaller round for the others, the trade SGLang's own
in-batch prefix caching makes. Each hold advances the request's hit past p, so a request is
held back a bounded number of times. A held-back request gives back the Mamba slot its match
staged, as SGLang does for a request it does not admit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Fewer shared uncached tokens than this are not worth a round of waiting.
MIN_SAVED = 32


def should_wait(cache: Any, req: Any, admitted: Sequence[Any]) -> bool:
    """Whether `req` waits one round for a checkpoint an admitted request captures now."""
    if getattr(cache, "captures", None) is None:
        return False
    start, total = int(req.prefix_len), len(req.full_untruncated_fill_ids)
    todo = total - start
    # p == total is useless to wait for: a hit leaves at least the last token to compute, and
    # no state sits before it (two identical prompts in one round both prefill, as in SGLang).
    mine = [
        p
        for p in cache.plans.get(req.rid).positions
        if p < total and p - start >= max(MIN_SAVED, todo / 2)
    ]
    for p in reversed(mine):  # the deepest shared checkpoint saves the most
        for other in admitted:
            if _captures_for(cache, other, p, req):
                return True
    return False


def _captures_for(cache: Any, other: Any, p: int, req: Any) -> bool:
    """`other` computes position p this round, captures it, and shares req's tokens up to p."""
    if not int(other.prefix_len) < p <= int(other.extend_end):
        return False
    if p not in cache.plans.get(other.rid).positions:
        return False
    return bool(other.full_untruncated_fill_ids[:p] == req.full_untruncated_fill_ids[:p])


def give_back_staged_state(cache: Any, req: Any) -> None:
    """Undo what the match staged for a request that is not admitted this round (SGLang does
    the same for a request its adder rejects): the copy-on-write source and the live slot."""
    req.kv.mamba_cow_src_index = None
    req.kv.mamba_needs_clear = False
    if req.kv.holds_mamba and not getattr(req, "session", None):
        cache.req_to_token_pool.mamba_allocator.free(req.kv.mamba_pool_idx.unsqueeze(-1))
        req.kv.mamba_pool_idx = None
