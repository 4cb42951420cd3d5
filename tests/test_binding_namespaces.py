"""Namespaces through SGLang's own scheduler calls on its CPU pools (tests/mamba_session.py).

SGLang builds every key of a request as `RadixKey(ids, req.extra_key, req.cache_salt)`, and its
`Req` appends the LoRA adapter's id to `extra_key`. Requests of two namespaces send the same
prompt: neither reuses the other's KV slots or Mamba states (a state is a slot whose content
names the prefix and the request it was computed for), each hits its own, eviction picks its
victims across namespaces under the one budget, and after every step each Mamba slot has one
owner and the tree's invariants hold (`slots_balance`).
"""

from __future__ import annotations

from array import array
from types import SimpleNamespace
from typing import Any

import pytest

from jenga_sglang.binding.cache.namespaces import namespace_of
from tests.mamba_session import Session, expected, load_sg, tokens
from tests.test_binding_backend import _cache

pytestmark = pytest.mark.sglang

SALTS = ("tenant-a", "tenant-b")


@pytest.fixture(scope="module")
def sg() -> Any:
    return load_sg()


def _salted(salt: str | None) -> str | None:
    return namespace_of(None, salt)


def test_two_salts_same_prompt_share_nothing_and_hit_their_own(sg: Any) -> None:
    s = Session(sg)
    a, out = tokens(0, 80), tokens(3, 5)
    for salt in (*SALTS, None):
        hit, seeded = s.serve(a, out, cache_salt=salt)
        assert hit == 0 and seeded is None  # the same prompt: nothing across namespaces
        s.slots_balance()
    end = len(a) + len(out) - 1  # the last sampled token never gets KV
    nodes = {salt: s.state_node(a + out, end, _salted(salt)) for salt in (*SALTS, None)}
    slots = {salt: node.state.ids()[0] for salt, node in nodes.items()}
    kv = {salt: s.cache.path_device_indices(node).tolist() for salt, node in nodes.items()}
    assert len(set(slots.values())) == 3  # one state per namespace
    assert not set(kv["tenant-a"]) & set(kv["tenant-b"])  # and KV slots of its own
    turn2 = a + out + tokens(5, 30, base=60)
    for salt in SALTS:
        req = s.admit(turn2, 3, cache_salt=salt)
        assert req.prefix_len == end  # hits within its salt
        assert int(req.kv.mamba_cow_src_index[0]) == slots[salt]  # seeded from its own state
        # the slots SGLang reads into the request's row (`alloc_for_extend`): its own KV
        assert s.cache.path_device_indices(req.last_node).tolist() == kv[salt]
        s.prefill(req, 1)
        assert s.read(int(req.kv.mamba_pool_idx)) == expected(sg, turn2)
        s.decode_and_finish(req, turn2, [1, 2, 3])
        s.slots_balance()
    assert sorted(s.cache.cache.tree.spaces) == sorted(map(_salted, SALTS))


def test_lora_adapters_are_namespaces_apart_from_salts(sg: Any) -> None:
    """`Req` appends `lora_id` to `extra_key`: two adapters, and an adapter with a salt, are
    three namespaces; a salt spelled like an adapter's id is a fourth (namespace_of)."""
    s = Session(sg)
    a, out = tokens(0, 60), [1, 2]
    kinds = [
        {"lora_id": "adapter-1"},
        {"lora_id": "adapter-2"},
        {"lora_id": "adapter-1", "cache_salt": "t"},
    ]
    for fields in kinds:
        assert s.serve(a, out, **fields)[0] == 0
    for fields in kinds:
        hit, seeded = s.serve([*a, *out, 9, 9, 9], [3], **fields)
        assert hit == len(a) + 1 and seeded == expected(sg, [*a, 1])
        s.slots_balance()
    assert len(s.cache.cache.tree.spaces) == 3
    assert namespace_of("adapter-1", None) != namespace_of(None, "adapter-1")
    assert namespace_of("", None) != namespace_of(None, None) is None


def test_eviction_picks_the_least_recent_entry_in_any_namespace(sg: Any) -> None:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    s = Session(sg)
    a, out = tokens(0, 80), [1, 2]
    s.serve(a, out, cache_salt="old")
    s.serve(a, out, cache_salt="new")
    other = tokens(1, 80, base=30)
    s.serve(other, out)  # the default namespace, the most recent
    evicted = s.cache.evict(EvictParams(num_tokens=40))  # SGLang is 40 slots short
    assert evicted.num_tokens_evicted > 0
    assert s.cached_length(a, _salted("old")) == 0  # the least recent went first
    assert _salted("old") not in s.cache.cache.tree.spaces  # with its namespace's root
    assert s.cached_length(a, _salted("new")) == len(a)  # the others stay
    assert s.cached_length(other) == len(other)
    s.slots_balance()
    hit, seeded = s.serve([*a, 1, 5, 5], [3], cache_salt="new")
    assert hit == len(a) + 1 and seeded == expected(sg, [*a, 1])
    s.slots_balance()


def _rewriting(s: Session) -> None:
    admission = s.cache.cache.admission
    admission.min_samples, admission.min_branch_tokens = 1, 0


def test_ghost_branch_points_do_not_cross_namespaces(sg: Any) -> None:
    """A rewriting workload in salt "a": once the tree evicted its history, the ghost names
    its branch point to "a" only; the same tokens in salt "b" plan nothing there."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    s = Session(sg, admission="jenga")
    _rewriting(s)
    a = tokens(0, 80)
    s.serve(a, [1, 2], cache_salt="a")
    s.serve(a[:40] + tokens(5, 20, base=60), [3, 4], cut_at=40, cache_salt="a")
    s.cache.evict(EvictParams(num_tokens=10**6, mamba_num=10**6))
    assert not s.cache.cache.tree.spaces  # everything evicted, namespace roots too
    c = a[:40] + tokens(5, 10, base=60) + tokens(2, 10, base=90)  # leaves the second at 50
    for salt, branch in (("b", None), ("a", 50)):
        req = s.admit(c, 2, cache_salt=salt)
        assert req.prefix_len == 0 and req.mamba_branching_seqlen == branch, salt
        s.prefill(req, 7, follow_plan=True)
        s.decode_and_finish(req, c, [7, 8])
        # b keeps its finish state (nothing it rewrote is known to it); a its branch state
        # and an expendable tail without one, as in the default namespace
        assert s.state_positions(c, _salted(salt)) == ([61] if branch is None else [50])
        s.slots_balance()


def test_sglang_insert_and_match_keep_the_key_namespace(sg: Any) -> None:
    """The `insert` / `match_prefix` pair SGLang calls with a `RadixKey` of its own."""
    from sglang.srt.mem_cache import base_prefix_cache as bpc
    from sglang.srt.mem_cache.radix_cache import RadixKey

    cache, allocator, _ = _cache(sg, mamba=False)
    ids = [1, 2, 3, 4, 5]

    def key(salt: str | None, extra: str | None = None) -> Any:
        return RadixKey(array("q", ids), extra_key=extra, cache_salt=salt)

    slots = allocator.alloc(len(ids))
    assert cache.insert(bpc.InsertParams(key=key("x"), value=slots)).prefix_len == 0
    match = cache.match_prefix(bpc.MatchPrefixParams(key=key("x")))
    assert match.device_prefix_len == 5
    assert cache.path_device_indices(match.last_device_node).tolist() == slots.tolist()
    for other in (key("y"), key(None), key(None, extra="x")):
        assert cache.match_prefix(bpc.MatchPrefixParams(key=other)).device_prefix_len == 0
    cache.sanity_check()


def test_dfs_weight_order_keeps_requests_of_every_namespace(sg: Any) -> None:
    """SGLang's `dfs-weight` schedule walks the tree down from `root_node`: the requests whose
    matched node lies in a named namespace must stay in the waiting queue."""
    s = Session(sg)
    a, out = tokens(0, 60), [1, 2]
    s.serve(a, out, cache_salt="x")
    s.serve(a, out)
    nodes = [s.state_node(a + out[:1], len(a) + 1, ns) for ns in (_salted("x"), None)]
    handles = [nodes[0], s.cache.root_node, nodes[1], nodes[0]]
    order = s.cache.dfs_weight_order(handles)
    assert sorted(order) == [0, 1, 2, 3]


def _waiting(rid: str, ids: list[int], prefix: int, salt: str | None) -> Any:
    """What `should_wait` reads of a waiting `Req` (test_binding_prefill_cut.py's, salted)."""
    return SimpleNamespace(
        rid=rid,
        prefix_len=prefix,
        extend_end=len(ids),
        full_untruncated_fill_ids=ids,
        extra_key=None,
        cache_salt=salt,
    )


@pytest.fixture
def inpass_cache(sg: Any) -> Any:
    from jenga_sglang.binding.cache.backend import JengaRadixCache
    from jenga_sglang.binding.options import JengaOptions
    from jenga_sglang.models import get_spec
    from tests.test_binding_backend import _params

    return JengaRadixCache(
        _params(True, 256), get_spec("nemotron-h-8b"), JengaOptions(True), inpass=True
    )


def test_a_request_waits_only_for_captures_of_its_own_namespace(inpass_cache: Any) -> None:
    from jenga_sglang.binding.cache.plans import Planned
    from jenga_sglang.binding.capture.shared_prefill import should_wait

    system = list(range(10, 110))  # 100 shared tokens past the cached 20
    a = _waiting("a", system + [1] * 30, 20, "x")
    mine = _waiting("b", system + [2] * 30, 20, "x")
    theirs = _waiting("c", system + [2] * 30, 20, "y")
    plain = _waiting("d", system + [2] * 30, 20, None)
    for r in (a, mine, theirs, plain):
        inpass_cache.plans.remember(r.rid, Planned((100, 130), namespace=_salted(r.cache_salt)))
    assert should_wait(inpass_cache, mine, [a])  # a captures 100 in x: b hits it next round
    assert not should_wait(inpass_cache, theirs, [a])  # never in y's subtree
    assert not should_wait(inpass_cache, plain, [a])


def test_a_new_branch_is_planned_only_for_a_request_of_the_same_namespace(
    inpass_cache: Any,
) -> None:
    from jenga_sglang.binding.cache.plans import Planned
    from jenga_sglang.binding.capture.shared_prefill import should_wait

    system = list(range(10, 410))  # 400 uncached tokens two requests share
    a = _waiting("a", system + [1] * 60, 0, "x")
    b = _waiting("b", system + [2] * 60, 0, "y")
    for r in (a, b):
        inpass_cache.plans.remember(r.rid, Planned((460,), namespace=_salted(r.cache_salt)))
    assert not should_wait(inpass_cache, b, [a])
    assert inpass_cache.plans.get("a").positions == (460,)  # a's plan is left alone
    assert inpass_cache.shared_branches == 0


def test_captures_in_flight_hold_back_nobody_while_a_namespace_has_one(
    inpass_cache: Any,
) -> None:
    """A capture in flight does not say whose it is: with one of a named namespace in flight,
    waiting for captures in flight stops (capture/shared_prefill.py); without, it is as before."""
    from jenga_sglang.binding.cache.captures import PendingCaptures
    from jenga_sglang.binding.cache.plans import Planned
    from jenga_sglang.binding.capture.shared_prefill import should_wait

    slots = [3, 4]
    inpass_cache.captures = PendingCaptures(lambda: slots.pop() if slots else None, print)
    system = list(range(10, 410))
    inpass_cache.captures.plan([("a", 0, 460, (400,), system + [1] * 60)])
    inpass_cache.plans.remember("a", Planned((400,)))
    b = _waiting("b", system + [2] * 60, 0, None)
    inpass_cache.plans.remember("b", Planned((460,)))
    assert should_wait(inpass_cache, b, [])  # a default-namespace capture in flight
    inpass_cache.captures.plan([("s", 0, 460, (400,), system + [3] * 60)])
    inpass_cache.plans.remember("s", Planned((400,), namespace=_salted("x")))
    assert not should_wait(inpass_cache, b, [])  # s's is in flight too: whose is which?
    salted = _waiting("t", system + [2] * 60, 0, "x")
    inpass_cache.plans.remember("t", Planned((460,), namespace=_salted("x")))
    assert not should_wait(inpass_cache, salted, [])
    inpass_cache.captures.drop("s")
    assert should_wait(inpass_cache, b, [])
    inpass_cache.plans.pop("s")
    inpass_cache.plans.pop("t")
    assert not inpass_cache.plans.namespaced
