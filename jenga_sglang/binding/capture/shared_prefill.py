"""Do not prefill one uncached prefix twice: wait for its in-pass checkpoint instead.

Waiting requests often share a prefix the tree cannot serve yet: a shared system prompt, the
first turns of forked programs. A round that admits them all prefills that prefix once per
request, because none of their checkpoints exists before the round's forward. Instead, when
another request computes the shared prefix [.., p) and captures the state at p in-pass
(binding/cache/captures.py), a request that shares it is held back: once that capture is in the
tree, it hits p.

    round k:   A: hit ....... p ....... end        (captures the state at p)
               B: hit ....... p ... end            held back: [hit, p) would be computed twice
    round k+1: B:             p ... end            hits p

Three cases, on the same tokens up to p:
* B's own plan names p and a request admitted this round captures p (both leave the tree there);
* B and a request A admitted this round share [.., p) and part there, with no node of the tree
  at p yet (both arrived before either was cached): p is the branch point speculative insertion
  would plan for B once A is in the tree, so A's plan gets p and B waits;
* a capture at p planned in an earlier round is still in flight (with overlap scheduling the
  next round is scheduled before the last one's checkpoint hands its captures to the tree).

Held back only for a p short of the request's own end, and only when that saves at least half
of the request's uncached tokens (and at least `MIN_SAVED` tokens): one round of waiting then
buys a shorter prefill for it and a smaller round for the others, the trade SGLang's in-batch
prefix check makes for its own cache. Waiting ends: a capture is in flight only until the next
checkpoint of its request takes it or its release drops it, and once it is in the tree the
request's hit reaches p, so p saves nothing more. A held-back request gives back the Mamba slot
its match staged, as SGLang does for a request it does not admit.

Only requests of one namespace (LoRA adapter, cache salt: binding/cache/namespaces.py) count as
sharing: another namespace's capture never enters this request's subtree, and waiting for it
would tell the request, by its delay, what another tenant is prefilling. A capture in flight
does not say whose it is, so while any request with a namespace has one in flight, no request
waits for captures in flight (they wait only for the round's own requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jenga_sglang.binding.cache.namespaces import request_namespace

#: Fewer shared uncached tokens than this are not worth a round of waiting.
MIN_SAVED = 32


def should_wait(cache: Any, req: Any, admitted: Sequence[Any]) -> bool:
    """Whether `req` waits for a checkpoint another request captures (see the module doc)."""
    if getattr(cache, "captures", None) is None:
        return False
    ids = req.full_untruncated_fill_ids
    start, total = int(req.prefix_len), len(ids)
    need = max(MIN_SAVED, (total - start) / 2)

    def saves(p: int) -> bool:
        # p == total is useless: a hit leaves the last token to compute, and no state precedes it.
        return p < total and p - start >= need

    namespace = request_namespace(req)
    peers = [other for other in admitted if request_namespace(other) == namespace]
    mine = [p for p in cache.plans.get(req.rid).positions if saves(p)]
    for p in reversed(mine):  # the deepest shared checkpoint saves the most
        if any(_captures_for(cache, other, p, ids) for other in peers):
            return True
    for other in peers:
        if _share_new_branch(cache, other, ids, saves):
            return True
    if namespace is not None or _namespaced_in_flight(cache):
        return False  # whose capture is in flight is unknown (module doc)
    return any(saves(p) and _shared(t, ids, p) == p for p, t in cache.captures.in_flight())


def _namespaced_in_flight(cache: Any) -> bool:
    """Whether a request with a namespace has a capture in flight."""
    return any(rid in cache.captures for rid in cache.plans.namespaced)


def _captures_for(cache: Any, other: Any, p: int, ids: Sequence[int]) -> bool:
    """`other` computes position p this round, captures it, and shares `ids` up to p."""
    if not int(other.prefix_len) < p <= int(other.extend_end):
        return False
    if p not in cache.plans.get(other.rid).positions:
        return False
    return _shared(other.full_untruncated_fill_ids, ids, p) == p


def _share_new_branch(cache: Any, other: Any, ids: Sequence[int], saves: Any) -> bool:
    """`other` computes, this round, the prefix it shares with `ids` up to where they part:
    plan its capture there (the branch point of the two) and say so."""
    end = int(other.extend_end)
    p = _shared(other.full_untruncated_fill_ids, ids, end + 1)
    if not (saves(p) and int(other.prefix_len) < p <= end):
        return False
    planned = cache.plans.get(other.rid)
    if p not in planned.positions:
        positions = tuple(sorted((*planned.positions, p)))
        cache.plans.remember(other.rid, planned._replace(positions=positions))
        cache.shared_branches += 1
    return True


def _shared(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the common prefix of `a` and `b`, at most `limit` (numpy: SGLang's ids are
    int64 arrays, compared in bulk)."""
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.size else n


def give_back_staged_state(cache: Any, req: Any) -> None:
    """Undo what the match staged for a request that is not admitted this round (SGLang does
    the same for a request its adder rejects): the copy-on-write source and the live slot."""
    req.kv.mamba_cow_src_index = None
    req.kv.mamba_needs_clear = False
    if req.kv.holds_mamba and not getattr(req, "session", None):
        cache.req_to_token_pool.mamba_allocator.free(req.kv.mamba_pool_idx.unsqueeze(-1))
        req.kv.mamba_pool_idx = None
