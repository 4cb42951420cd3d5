"""SlotMemory, the tree's memory inside SGLang: separate pools vs one shared byte pool
(SGLang's --enable-unified-memory), and who says when an allocation fits (no sglang here)."""

from __future__ import annotations

import pickle

from radix_helpers import KV_TOKEN, hybrid_spec, seq

from jenga_sglang.binding.slots.memory import SlotMemory
from jenga_sglang.policies.admission import SpeculativeAdmission
from jenga_sglang.policies.eviction import FlopAwareEviction
from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.pages import PageKind, PageType

SPEC = hybrid_spec()
KV = PageType(PageKind.KV, 0)
ST = PageType(PageKind.STATE, 1)
STATE = SPEC.state_bytes  # 80 bytes = 5 tokens of KV


def _cache(shared: bool) -> tuple[PrefixCache, SlotMemory]:
    """10 tokens of KV and 2 states fill the memory exactly, either way."""
    capacity = {KV: 20, ST: 4} if shared else {KV: 10, ST: 2}
    budget = 10 * KV_TOKEN + 2 * STATE if shared else None
    memory = SlotMemory(capacity, {KV: KV_TOKEN, ST: STATE}, None, budget)
    cache = PrefixCache(SPEC, memory, FlopAwareEviction(alpha=0.0), SpeculativeAdmission())
    key = seq(0, 10)
    kv = cache.allocate_kv(10, owner=0)
    states = cache.allocate_states(2, owner=0)
    cache.tree.insert(key, 0, kv, {4: states[0], 10: states[1]}, cache.tick())
    # A look-up refreshes the deepest node: the checkpoint at 4 is the oldest candidate.
    cache.admit(key, cache.lookup(key))
    return cache, memory


def test_shared_pool_dropping_a_state_makes_room_for_kv() -> None:
    cache, memory = _cache(shared=True)
    assert (memory.room(KV), memory.room(ST)) == (0, 0)
    assert SPEC.state_bytes == 5 * KV_TOKEN
    assert memory.make_room(KV, 5)
    # One victim: the checkpoint at 4 (its node merges into the child). Its 80 bytes are the
    # 5 tokens asked for, so the rest stays: counting freed KV *slots* would have gone on
    # and evicted the whole sequence.
    assert (cache.tree.evicted_states, cache.tree.evicted_nodes) == (1, 0)
    assert memory.room(KV) == 5 and memory.usage(KV).free == 5
    assert cache.tree.match(seq(0, 10)).length == 10
    cache.check_integrity()


def test_shared_pool_evicting_kv_makes_room_for_a_state() -> None:
    for shared in (True, False):
        capacity = {KV: 20, ST: 4} if shared else {KV: 15, ST: 1}
        memory = SlotMemory(capacity, {KV: KV_TOKEN, ST: STATE}, None, 320 if shared else None)
        cache = PrefixCache(SPEC, memory, FlopAwareEviction(alpha=0.0), SpeculativeAdmission())
        cache.tree.insert(seq(100, 5), 0, cache.allocate_kv(5, 0), {}, cache.tick())
        kv, (state,) = cache.allocate_kv(10, 0), cache.allocate_states(1, 0)
        cache.tree.insert(seq(0, 10), 0, kv, {10: state}, cache.tick())
        assert memory.room(ST) == 0
        assert memory.make_room(ST, 1)
        # The oldest victim is the stateless 5-token entry. On the shared pool its 80 bytes
        # are one state: the checkpointed sequence stays. Separate pools need a state slot.
        hit = cache.tree.match(seq(0, 10)).length
        assert (hit, cache.tree.evicted_states) == ((10, 0) if shared else (0, 1))
        cache.check_integrity()


def test_separate_pools_free_only_the_short_type() -> None:
    cache, memory = _cache(shared=False)
    assert memory.make_room(KV, 5)
    # A state frees no KV slot here: the policy's next victim, the leaf, goes too.
    assert (cache.tree.evicted_states, cache.tree.evicted_nodes) == (2, 1)
    assert memory.room(KV) == 10 and memory.room(ST) == 2


def test_the_engine_says_what_fits_and_a_copy_forgets_it() -> None:
    engine_room = {KV: 0, ST: 0}
    memory = SlotMemory({KV: 20, ST: 4}, {KV: KV_TOKEN, ST: STATE}, None, 320, engine_room.get)
    assert memory.room(KV) == 0  # the engine's count, not the model's 20
    engine_room[KV] = 7
    assert memory.make_room(KV, 7)  # already true: nothing to evict
    copy = pickle.loads(pickle.dumps(memory))  # the alpha tuner replays on such a copy
    assert copy.room(KV) == 20 and copy.room(ST) == 4  # its own byte model


def test_a_pickled_cache_keeps_its_evictor() -> None:
    """The alpha tuner replays on a pickled copy, which must evict through its own tree; with
    the compiled build the evictor lives in a native slot of `CacheMemory`, not `__dict__`."""
    cache, _ = _cache(shared=False)
    copy = pickle.loads(pickle.dumps(cache))
    assert copy.memory.make_room(KV, 5)
    assert copy.tree.evicted_nodes + copy.tree.evicted_states > 0
    assert cache.tree.evicted_nodes == cache.tree.evicted_states == 0
    copy.check_integrity()
