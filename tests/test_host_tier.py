"""The host-memory tier (radix/host.py, radix/host_load.py, policies/host.py;
docs/host-tier.md): demotion of leaves and checkpoints, host hits and load-back, host eviction,
the policy's demote / drop / load decisions, windows, runs, and the invariants per tier.

Small specs (tests/radix_helpers.py): one KV token = 16 bytes, one hybrid state = 80 bytes.
Device budgets are sized so that a second sequence evicts the first."""

from __future__ import annotations

import pickle

from radix_helpers import KV_TOKEN, attention_spec, hybrid_spec, seq

from jenga_sglang.models.spec import ModelSpec
from jenga_sglang.policies.admission import EveryBlockAdmission, SpeculativeAdmission
from jenga_sglang.policies.bundles import byte_budget
from jenga_sglang.policies.eviction import FlopAwareEviction, LruEviction
from jenga_sglang.policies.host import FlopAwareTier, entry_value, overlapped_seconds
from jenga_sglang.radix.cache import PrefixCache, ServeResult
from jenga_sglang.radix.contracts import AdmissionPolicy, EvictionPolicy
from jenga_sglang.radix.host import HostCopies, HostTier
from jenga_sglang.radix.memory import ByteBudget
from jenga_sglang.radix.node import Node
from jenga_sglang.radix.pages import Pages, PageType
from jenga_sglang.radix.tokens import TokenSeq

STATE = 80  # bytes of one hybrid_spec() state
FAST, SLOW = 1e12, 1e-3  # host links: loads always / never beat recompute at RATE
RATE = 1e3  # FLOP/s the tier weighs recompute at (the tiny spec's FLOPs are small)


def tiered(
    spec: ModelSpec,
    device: int,
    host: int,
    eviction: EvictionPolicy | None = None,
    admission: AdmissionPolicy | None = None,
    bandwidth: float = FAST,
) -> PrefixCache:
    """A cache of `device` bytes over a host tier of `host` bytes (0: no tier)."""
    eviction = eviction or LruEviction()
    cache = PrefixCache(
        spec, byte_budget(spec, device), eviction, admission or SpeculativeAdmission()
    )
    if host:
        tier = FlopAwareTier(eviction, bandwidth, RATE, layers=2)
        cache.attach_host(byte_budget(spec, host), tier)
    return cache


def tier(cache: PrefixCache) -> HostTier:
    assert cache.host is not None
    return cache.host


def host_memory(cache: PrefixCache) -> ByteBudget:
    memory = tier(cache).memory
    assert isinstance(memory, ByteBudget)
    return memory


def serve(cache: PrefixCache, inp: TokenSeq, out: TokenSeq) -> ServeResult:
    result = cache.serve(inp, out, owner=0)
    cache.check_integrity()
    return result


def host_node(cache: PrefixCache, first: int) -> Node:
    """The root's host child whose edge starts with token `first`."""
    (node,) = [n for n in cache.root.host_children.values() if n.key.tolist()[0] == first]
    return node


# one sequence of 10 input + 2 output tokens holds 12 KV tokens (192 bytes) and a state at its
# end (80 bytes): 272 bytes; a 300-byte device holds one such sequence, not two
DEVICE, ONE = 300, 12 * KV_TOKEN + STATE


def test_a_device_victim_moves_to_host_whole_and_comes_back_on_a_hit() -> None:
    spec = hybrid_spec()
    cache = tiered(spec, DEVICE, 4 * ONE)
    a_in, a_out, b_in = seq(0, 10), seq(100, 2), seq(200, 10)
    serve(cache, a_in, a_out)
    written = serve(cache, b_in, seq(300, 2)).host_write_bytes
    a = host_node(cache, 0)
    assert a.host and a.host_state is not None and a.state is None, "A went down whole"
    assert written == ONE and host_memory(cache).held_bytes() == ONE
    assert not cache.root.children.get(a.key.head(0, 1)), "A left the device tree"
    again = serve(cache, a_in.concat(a_out).concat(seq(400, 3)), seq(500, 1))
    assert again.hit_tokens == 12 and again.host_hit_tokens == 12, "the hit is A's host copy"
    assert again.host_load_bytes == ONE, "KV of 12 tokens and one state crossed back"
    assert not a.host and a.state is not None, "A is on the device again"


def test_without_a_tier_the_same_requests_miss() -> None:
    cache = tiered(hybrid_spec(), DEVICE, 0)
    serve(cache, seq(0, 10), seq(100, 2))
    serve(cache, seq(200, 10), seq(300, 2))
    assert serve(cache, seq(0, 10).concat(seq(100, 2)), seq(500, 1)).hit_tokens == 0


def test_host_memory_evicts_its_least_recent_entry_when_full() -> None:
    """Host holds one sequence: B's demotion drops A's host copy (alpha 0: LRU)."""
    cache = tiered(hybrid_spec(), DEVICE, ONE)
    serve(cache, seq(0, 10), seq(100, 2))
    serve(cache, seq(200, 10), seq(300, 2))  # A -> host
    serve(cache, seq(600, 10), seq(700, 2))  # B -> host, A dropped from it
    assert tier(cache).dropped_nodes == 1
    assert [n.key.tolist()[0] for n in cache.root.host_children.values()] == [200]
    assert serve(cache, seq(200, 10).concat(seq(300, 2)), seq(9, 1)).host_hit_tokens == 12
    assert serve(cache, seq(0, 10).concat(seq(100, 2)), seq(9, 1)).hit_tokens == 0


def test_state_only_demotion_keeps_the_kv_on_the_device() -> None:
    spec = hybrid_spec()
    cache = tiered(spec, 10**4, 10**4, eviction=FlopAwareEviction(alpha=0.0))
    shared = seq(0, 8)
    serve(cache, shared.concat(seq(100, 4)), seq(900, 1))
    serve(cache, shared.concat(seq(200, 4)), seq(901, 1))
    (branch,) = cache.root.children.values()
    assert tier(cache).evict(branch), "a victim with children: its checkpoint moves"
    cache.check_integrity()
    assert branch.state is None and branch.host_state is not None and not branch.host
    result = serve(cache, shared.concat(seq(300, 4)), seq(902, 1))
    assert result.hit_tokens == 8 and result.host_hit_tokens == 8
    assert result.host_load_bytes == STATE, "only the checkpoint crossed: its KV was there"
    assert branch.state is not None and branch.host_state is None


def test_the_policy_drops_what_it_expects_dead() -> None:
    class Dead(FlopAwareEviction):  # (compiled, LRU takes no interpreted subclass)
        def reuse_odds(self, node: Node) -> float:
            return 0.0

    cache = tiered(hybrid_spec(), DEVICE, 4 * ONE, eviction=Dead())
    serve(cache, seq(0, 10), seq(100, 2))
    assert serve(cache, seq(200, 10), seq(300, 2)).host_write_bytes == 0
    assert tier(cache).demoted_nodes == 0 and not cache.root.host_children
    assert cache.evicted_nodes == 1


def test_demotion_weighs_the_recompute_by_the_odds_of_a_hit() -> None:
    """A link at which the load takes 2/3 of the recompute: worth it at odds 1, not at 1/2."""

    class Odds(FlopAwareEviction):
        odds = 1.0

        def reuse_odds(self, node: Node) -> float:
            return self.odds

    eviction = Odds()
    cache = tiered(hybrid_spec(), 10**4, 10**4, eviction=eviction)
    serve(cache, seq(0, 10), seq(100, 2))
    (leaf,) = cache.root.children.values()
    policy = tier(cache).policy
    assert isinstance(policy, FlopAwareTier)
    flops, held = entry_value(cache.cost, leaf, False)
    policy.bandwidth = 1.5 * held * RATE / flops
    assert policy.demotes(leaf, False)
    eviction.odds = 0.5
    assert not policy.demotes(leaf, False)


def test_a_slow_link_demotes_nothing_and_loads_nothing() -> None:
    """Loading is slower than recomputing: nothing goes down."""
    cache = tiered(hybrid_spec(), DEVICE, 4 * ONE, bandwidth=SLOW)
    serve(cache, seq(0, 10), seq(100, 2))
    serve(cache, seq(200, 10), seq(300, 2))
    assert tier(cache).demoted_nodes == 0 and cache.evicted_nodes == 1


def test_a_declined_load_recomputes_and_adopts_the_host_nodes() -> None:
    """Demoted over a fast link, then the link is slow: the hit is the device's, and the host
    nodes on the request's walk take the request's fresh pages (no bytes cross)."""
    cache = tiered(hybrid_spec(), DEVICE, 4 * ONE)
    serve(cache, seq(0, 10), seq(100, 2))
    serve(cache, seq(200, 10), seq(300, 2))
    a = host_node(cache, 0)
    policy = tier(cache).policy
    assert isinstance(policy, FlopAwareTier)
    policy.bandwidth = SLOW
    result = serve(cache, seq(0, 10).concat(seq(100, 2)), seq(9, 1))
    assert result.hit_tokens == 0 and result.host_hit_tokens == 0 and result.host_load_bytes == 0
    assert not a.host, "its KV is the request's now"


def test_dropping_a_device_leaf_drops_its_host_descendants() -> None:
    """A branch its device policy expects dead is dropped, and what hangs below it goes too."""

    class DeadBranch(FlopAwareEviction):
        def reuse_odds(self, node: Node) -> float:
            return float(node.end != 8)

    cache = tiered(hybrid_spec(), 10**4, 10**4, eviction=DeadBranch())
    serve(cache, seq(0, 8).concat(seq(100, 4)), seq(900, 1))
    serve(cache, seq(0, 8).concat(seq(200, 4)), seq(901, 1))
    (branch,) = cache.root.children.values()
    for tail in list(branch.children.values()):
        assert tier(cache).evict(tail), "both tails go to host"
    assert len(branch.host_children) == 2 and not branch.children
    cache.tree.evict_for(cache.kv_types[0])  # the branch itself is dropped, not demoted
    cache.check_integrity()
    assert branch.parent is None and not cache.root.children and not cache.root.host_children
    assert host_memory(cache).held_bytes() == 0 and tier(cache).dropped_nodes == 2


def test_a_leaf_run_sends_its_last_segment() -> None:
    """LRU keeps a chain of checkpoints (every 4 tokens) as one run: eviction moves the
    chain's leaf, as it would have dropped it, and the rest stays a run on the device."""
    spec = hybrid_spec()
    cache = tiered(spec, 10**4, 10**4, admission=EveryBlockAdmission(4))
    serve(cache, seq(0, 12), seq(100, 4))
    (run,) = cache.root.children.values()
    assert run.inner, "a run"
    cache.tree.evict_for(cache.kv_types[0])
    cache.check_integrity()
    (upper,) = cache.root.children.values()
    (moved,) = upper.host_children.values()
    assert moved is run and (moved.start, moved.end) == (12, 16) and not moved.inner
    assert [at for at, _ in upper.inner] == [4, 8] and upper.state is not None
    result = serve(cache, seq(0, 12).concat(seq(100, 4)), seq(7, 1))
    assert result.hit_tokens == 16 and result.host_hit_tokens == 4


def test_sliding_window_tombstones_travel_with_the_node() -> None:
    """A window group's dropped pages stay dropped on host; the window rule reads the same."""
    spec = attention_spec(window=3)
    cache = tiered(spec, 10**4, 10**4)
    serve(cache, seq(0, 10), seq(100, 2))
    (node,) = cache.root.children.values()
    from jenga_sglang.radix.evict import trim_window

    assert trim_window(cache.tree, 1)
    tomb = node.tombstones[1]
    assert tomb > 0
    cache.tree.evict_for(cache.kv_types[0])
    cache.check_integrity()
    assert node.host and node.tombstones[1] == tomb
    result = serve(cache, seq(0, 10).concat(seq(100, 2)), seq(9, 1))
    # the window's last 3 tokens are held: the whole sequence is a hit, its KV loaded
    assert result.hit_tokens == 12 and result.host_hit_tokens == 12
    pages = 12 + (12 - tomb)  # full group: 12 pages, window group: the untrimmed ones
    assert result.host_load_bytes == pages * KV_TOKEN  # KV_TOKEN: one group's page


def test_a_huge_host_changes_nothing_until_the_device_evicts() -> None:
    """With room on the device the tier is never used: identical results with or without."""
    results = []
    for host in (0, 10**6):
        cache = tiered(hybrid_spec(), 10**6, host, eviction=FlopAwareEviction(alpha=0.5))
        results.append([serve(cache, seq(i % 3, 9), seq(50 + i, 3))[:5] for i in range(12)])
    assert results[0] == results[1]


def test_the_cache_with_its_tier_pickles_and_replays_alike() -> None:
    """Alpha tuning replays windows from a pickled snapshot: the tier travels with it."""
    cache = tiered(hybrid_spec(), DEVICE, 4 * ONE)
    serve(cache, seq(0, 10), seq(100, 2))
    serve(cache, seq(200, 10), seq(300, 2))
    copy: PrefixCache = pickle.loads(pickle.dumps(cache))
    copy.check_integrity()
    request = (seq(0, 10).concat(seq(100, 2)), seq(9, 1))
    assert serve(copy, *request) == serve(cache, *request)


def test_overlapped_load_is_a_two_stage_pipeline() -> None:
    assert overlapped_seconds(0.0, 2.0, 4) == 2.0
    assert overlapped_seconds(4.0, 2.0, 4) == 1.0 + 0.5 + 3 * 1.0  # the load bounds it
    assert overlapped_seconds(1.0, 8.0, 4) == 0.25 + 2.0 + 3 * 2.0  # the compute bounds it


def test_host_checkpoint_is_replaced_by_a_fresh_device_one() -> None:
    """A request that checkpoints where a host checkpoint lies frees the host copy."""
    spec = hybrid_spec()
    cache = tiered(spec, 10**4, 10**4, eviction=FlopAwareEviction(alpha=0.0))
    shared = seq(0, 8)
    serve(cache, shared.concat(seq(100, 4)), seq(900, 1))
    serve(cache, shared.concat(seq(200, 4)), seq(901, 1))
    (branch,) = cache.root.children.values()
    assert tier(cache).evict(branch)
    policy = tier(cache).policy
    assert isinstance(policy, FlopAwareTier)
    policy.bandwidth = SLOW  # declined: the request recomputes and checkpoints at 8 again
    result = serve(cache, shared.concat(seq(300, 4)), seq(902, 1))
    assert result.hit_tokens == 0
    assert branch.state is not None and branch.host_state is None
    assert host_memory(cache).held_bytes() == 0


def test_tree_budget_and_host_budget_are_never_exceeded() -> None:
    cache = tiered(hybrid_spec(), DEVICE, 2 * ONE)
    for i in range(30):
        serve(cache, seq(1000 * (i % 5), 10), seq(50_000 + i, 2))
    device = cache.memory
    assert isinstance(device, ByteBudget)
    assert device.capacity_violations == 0 and host_memory(cache).capacity_violations == 0
    assert host_memory(cache).peak_bytes <= 2 * ONE


def test_a_request_leaving_a_host_node_mid_edge_sees_it_mid_edge() -> None:
    """The host node the request leaves inside moves whole: the admission sees a mid-edge
    branch with a tail, as without the tier, and the tail's bytes count as loaded."""
    cache = tiered(hybrid_spec(), DEVICE, 4 * ONE)
    serve(cache, seq(0, 10), seq(100, 2))
    serve(cache, seq(200, 10), seq(300, 2))  # A [0, 12) -> host
    a = host_node(cache, 0)
    tier_ = tier(cache)
    walk = cache.tree.walk(seq(0, 6).concat(seq(500, 4)))
    prepared = tier_.prepare(cache, seq(0, 6).concat(seq(500, 4)), walk, 10)
    assert prepared is not None
    after, found, (host_hit, load_bytes) = prepared
    branch = after.prefix(10).branch()
    assert (branch.length, branch.at_node_end, branch.tail) == (6, False, 6)
    assert found.length == host_hit == 0, "no checkpoint at 6: nothing to hit"
    assert load_bytes == 6 * KV_TOKEN, "A's part past the walk crossed; [0, 6) is recomputed"
    assert tier_.past_bytes == load_bytes, "and is counted as such"
    assert not a.host and (a.start, a.end) == (0, 12)
    cache.check_integrity()


def test_a_device_leaf_with_host_children_goes_down_not_away() -> None:
    """Its own worth may not pay a load (here the link is too slow for any), but dropping it
    would drop the host entries below it, whose prefix it is: it moves to host."""
    cache = tiered(hybrid_spec(), 10**4, 10**4)
    serve(cache, seq(0, 8).concat(seq(100, 4)), seq(900, 1))
    serve(cache, seq(0, 8).concat(seq(200, 4)), seq(901, 1))
    (branch,) = cache.root.children.values()
    for _ in range(2):
        cache.tree.evict_for(cache.kv_types[0])  # both tails go to host
    policy = tier(cache).policy
    assert isinstance(policy, FlopAwareTier)
    policy.bandwidth = SLOW
    cache.tree.evict_for(cache.kv_types[0])
    cache.check_integrity()
    assert branch.host and len(branch.host_children) == 2 and branch.parent is cache.root
    assert tier(cache).dropped_nodes == 0


def test_clear_walk_drops_the_host_part_of_an_insert_path() -> None:
    """The live tier's guard (binding/host/tier.py): a walk reaching a host node drops it and
    what hangs below; a walk on the device alone changes nothing."""
    cache = tiered(hybrid_spec(), DEVICE, 4 * ONE)
    serve(cache, seq(0, 10), seq(100, 2))
    serve(cache, seq(200, 10), seq(300, 2))  # A -> host
    host = tier(cache)
    assert not host.clear_walk(cache.tree.walk(seq(200, 12)))  # B is on the device
    a = host_node(cache, 0)
    assert host.clear_walk(cache.tree.walk(seq(0, 5)))
    assert a.parent is None and not cache.root.host_children
    assert host_memory(cache).held_bytes() == 0
    cache.check_integrity()


class Recorded(HostCopies):
    """Copies that record each move's sides (page counts)."""

    def __init__(self) -> None:
        self.moves: list[tuple[str, str, int, int]] = []

    def store(self, ptype: PageType, device: Pages, host: Pages) -> None:
        self.moves.append(("store", str(ptype), len(device), len(host)))

    def load(self, ptype: PageType, host: Pages, device: Pages) -> None:
        self.moves.append(("load", str(ptype), len(host), len(device)))

    def kept(self, ptype: PageType, device: Pages, host: Pages) -> None:
        self.moves.append(("kept", str(ptype), len(device), len(host)))


def test_copies_see_every_move_with_equal_sides() -> None:
    spec = hybrid_spec()
    cache = PrefixCache(spec, byte_budget(spec, DEVICE), LruEviction(), SpeculativeAdmission())
    copies = Recorded()
    cache.attach_host(
        byte_budget(spec, 4 * ONE), FlopAwareTier(cache.tree.policy, FAST, RATE, 2), copies
    )
    serve(cache, seq(0, 10), seq(100, 2))
    serve(cache, seq(200, 10), seq(300, 2))  # A -> host: its KV and its state
    assert sorted(m[0] for m in copies.moves) == ["store", "store"]
    assert sorted(m[2] for m in copies.moves) == [1, 12]
    copies.moves.clear()
    serve(cache, seq(0, 10).concat(seq(100, 2)).concat(seq(400, 3)), seq(500, 1))  # A back
    loads = [m for m in copies.moves if m[0] == "load"]
    assert sorted(m[2] for m in loads) == [1, 12]
    assert all(m[2] == m[3] for m in copies.moves), "each move's two sides hold as many pages"
