"""How a lease's sequence enters the tree (`PrefixCache.commit`): three ways, by what the
lease holds.

* `insert_walked`: nothing computed yet, a locked walk held since admission (sequential
  serving): allocate what the walk lacks and insert along it, with no second walk;
* `insert_extended`: pages computed step by step from the hit (`extend`, the engine): the tree
  changed since admission, so walk again, but only below the lease's locked node;
* `insert_unlocked`: no lock (Marconi's reference simulator): eviction may take the prefix
  itself, so walk, re-plan and allocate until nothing is missing.

Each returns False when the pages do not fit; what the lease holds is then freed by
`PrefixCache.release`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jenga_sglang.radix.lease import Lease, join
from jenga_sglang.radix.match import Walk
from jenga_sglang.radix.pages import OutOfMemory, Pages
from jenga_sglang.radix.tokens import TokenSeq

if TYPE_CHECKING:
    from jenga_sglang.radix.cache import PrefixCache


def insert_walked(
    cache: PrefixCache, lease: Lease, key: TokenSeq, positions: tuple[int, ...], now: int
) -> bool:
    """Allocate the pages the key needs beyond what the lease's walk found (locked since
    admission) and insert; False when they do not fit."""
    assert lease._ahead is not None, "a lease without pages commits the walk it was given"
    walk = lease._ahead.prefix(len(key))
    try:
        kv = cache.allocate_kv(len(key) - walk.length, lease._owner)
        try:
            states = cache.allocate_states(len(positions), lease._owner)
        except OutOfMemory:
            cache.free(kv, None)
            raise
    except OutOfMemory:
        return False
    mapping = dict(zip(positions, states, strict=True))
    cache.tree.insert(key, walk.length, kv, mapping, now, walk=walk, namespace=lease.namespace)
    return True


def insert_extended(
    cache: PrefixCache, lease: Lease, key: TokenSeq, positions: tuple[int, ...], now: int
) -> bool:
    """Insert the pages `extend` gave the lease for [hit, len(key)) (freeing those past it)
    with its checkpoints, allocating the states it lacks; False (its pages freed) when
    they do not fit. Other requests changed the tree since admission: the walk starts
    from the lease's locked node, after the allocations (they may evict)."""
    extra = max(0, len(positions) - len(lease._states))
    try:
        states = lease._states + cache.allocate_states(extra, lease._owner)
    except OutOfMemory:
        return False  # `release` frees what the lease holds
    keep = len(key) - lease.hit
    kv: list[Pages] = []
    for ptype, chunks in zip(cache.tree.kv_types, lease._kv, strict=True):
        head, tail = join(chunks).split(keep)
        if len(tail):
            cache.memory.free(ptype, tail)
        kv.append(head)
    cache.free(None, states[len(positions) :])
    lease._kv, lease._states = [], []
    mapping = dict(zip(positions, states, strict=False))
    walk = cache.tree.walk(key, lease._start, lease.namespace)
    cache.tree.insert(key, lease.hit, kv, mapping, now, walk=walk, namespace=lease.namespace)
    return True


def insert_unlocked(
    cache: PrefixCache, lease: Lease, key: TokenSeq, positions: tuple[int, ...], now: int
) -> bool:
    """`insert_walked` without the lock: the reference simulator evicts before it inserts and
    counts every node among the candidates, the request's own prefix included. An eviction
    that takes part of the prefix leaves more of the key to store, and may remove the node
    the planned branch checkpoint would have split (the reference then needs no branch
    state), or merge the node the key left at into its only child, so that the key now
    leaves inside an edge (the reference then splits it, with a state): walk again, re-plan,
    and allocate what is now missing, until nothing is. Like the reference, it makes room for
    a leaf and a split state even when it stores fewer (`_reserved_states`).

    Terminates: inside the loop the tree only loses nodes, so the walk only shortens, the
    node end it stops at (if any) can only be merged away, never come back, and `held` only
    grows (to at most len(key)); once the walk stops changing the plan is fixed, and one
    more pass allocates exactly what it lacks."""
    kv: list[Pages] | None = None
    states: list[Pages] = []
    held = 0  # tokens [len(key) - held, len(key)) have pages in `kv`
    walked: tuple[int, bool] | None = None  # (length, inside an edge) of the last walk
    try:
        while True:
            walk = cache.tree.walk(key, namespace=lease.namespace)
            inside_edge = not walk.branch().at_node_end
            shape = (walk.length, inside_edge)
            if walked is not None and shape != walked:
                positions = _replan(cache, lease, walk, len(key))
            walked = shape
            missing = len(key) - walk.length - held
            if missing > 0:
                more = cache.allocate_kv(missing, lease._owner)
                kv = more if kv is None else [m.concat(k) for m, k in zip(more, kv, strict=True)]
                held += missing
                continue  # the KV allocation may have evicted part of the prefix
            room = max(len(positions), _reserved_states(cache, inside_edge))
            while len(states) > room:
                cache.free(None, [states.pop()])
            if len(states) < room:
                states += cache.allocate_states(room - len(states), lease._owner)
                continue  # so may the states'
            break
    except OutOfMemory:
        cache.free(kv, states)
        return False
    cache.free(None, states[len(positions) :])  # room made, not stored (_reserved_states)
    del states[len(positions) :]
    if kv is None:
        kv = cache.allocate_kv(0, lease._owner)
    mapping = dict(zip(positions, states, strict=True))
    cache.tree.insert(key, walk.length, kv, mapping, now, walk=walk, namespace=lease.namespace)
    return True


def _reserved_states(cache: PrefixCache, inside_edge: bool) -> int:
    """States the reference simulator makes room for before it inserts: one for the leaf, and
    one more when the sequence leaves the tree inside an edge (the split), whether or not it
    then stores them (a sequence already cached to a node end stores none; one ending inside
    an edge stores only the split's). It over-evicts by a state then, and so must we to evict
    what it evicts."""
    if cache.tree.state_type is None:
        return 0
    return 1 + inside_edge


def _replan(cache: PrefixCache, lease: Lease, walk: Walk, total: int) -> tuple[int, ...]:
    """Checkpoint positions for the tree as it now is. The prefill ran from the lease's hit,
    but the eviction may have taken the checkpoints up to it: the plan counts only those the
    tree still holds as had (the state at the hit itself is at hand, so it may be stored
    again)."""
    inp, hit = lease.tokens, lease.hit
    own = walk if cache.admission.plans_on_sequence else walk.prefix(len(inp))
    branch = cache.admission.recall(inp, own.branch(), lease.namespace)
    had = max((p for p in walk.checkpoints() if p <= hit), default=0)
    plan = cache.on_pages(cache.admission.plan(branch, len(inp), total, had), had)
    return plan.positions if cache.tree.state_type is not None else ()
