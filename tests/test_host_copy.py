"""Clean host copies (radix/host_copy.py): a load-back leaves its host pages holding the
node's bytes, so the node's next demotion writes only what the copy lacks; copies follow
their node through splits and merges, and host memory gives them up last.

Specs and sizes as tests/test_host_tier.py: one KV token = 16 bytes, one state = 80 bytes."""

from __future__ import annotations

from radix_helpers import KV_TOKEN, hybrid_spec, seq

from jenga_sglang.radix.cache import PrefixCache
from jenga_sglang.radix.node import Node
from tests.test_host_tier import ONE, STATE, host_memory, serve, tier, tiered

A_IN, A_OUT = seq(0, 10), seq(100, 2)  # A: [0, 12), a checkpoint at 12
A = A_IN.concat(A_OUT)


def loaded_back(cache: PrefixCache) -> Node:
    """A served, sent to host whole, then loaded back by a request that extends it by a
    token: A is on the device again, its host pages kept as its copy."""
    serve(cache, A_IN, A_OUT)
    (a,) = cache.root.children.values()
    assert tier(cache).evict(a) and a.host
    result = serve(cache, A, seq(500, 1))
    assert result.host_hit_tokens == 12
    assert not a.host and a.host_copy is not None and a in tier(cache).clean
    assert host_memory(cache).held_bytes() == ONE, "A's host pages stayed, as its copy"
    return a


def send_children_down(cache: PrefixCache, node: Node) -> int:
    """Demote `node`'s device children; the bytes that wrote."""
    host = tier(cache)
    before = host.write_bytes
    for child in list(node.children.values()):
        assert host.evict(child)
    cache.check_integrity()
    return host.write_bytes - before


def test_a_loaded_node_demoted_again_writes_nothing_and_hits_again() -> None:
    cache = tiered(hybrid_spec(), 10**4, 10**4)
    a = loaded_back(cache)
    host = tier(cache)
    assert send_children_down(cache, a) > 0, "the request's new token is written"
    written = host.write_bytes
    assert not a.children and host.evict(a)
    cache.check_integrity()
    assert host.write_bytes == written, "A went down onto its copy"
    assert host.kept_bytes == ONE
    assert a.host and a.host_copy is None and not host.clean
    again = serve(cache, A.concat(seq(500, 1)).concat(seq(7, 2)), seq(8, 1))
    assert again.host_hit_tokens >= 12, "A's host pages serve the hit again"


def test_a_split_copy_goes_with_both_halves() -> None:
    """A request branching inside A cuts it at 6: each half keeps its part of the copy, and
    the lower half goes down onto its part."""
    cache = tiered(hybrid_spec(), 10**4, 10**4)
    a = loaded_back(cache)
    serve(cache, seq(0, 6).concat(seq(700, 4)), seq(9, 1))
    upper = a.parent
    assert upper is not None and (upper.start, upper.end, a.start) == (0, 6, 6)
    assert upper.host_copy is not None and a.host_copy is not None
    assert [len(p) for p in upper.host_copy.kv] == [6]
    assert [len(p) for p in a.host_copy.kv] == [6] and a.host_copy.state is not None
    cache.check_integrity()
    host = tier(cache)
    send_children_down(cache, a)
    kept = host.kept_bytes
    assert host.evict(a)
    assert host.kept_bytes - kept == 6 * KV_TOKEN + STATE
    cache.check_integrity()


def test_a_merge_keeps_the_head_and_the_demotion_writes_the_tail() -> None:
    """A's checkpoint dropped, A merges into the request's new token below it: the merged
    node's copy holds A's 12 tokens, and its demotion writes only the 13th (and its state)."""
    cache = tiered(hybrid_spec(), 10**4, 10**4)
    a = loaded_back(cache)
    (child,) = a.children.values()
    child_state = STATE if child.state is not None else 0
    cache.tree.drop_state(a)
    cache.check_integrity()
    assert a.parent is None and child.start == 0, "A merged into its child"
    assert child.host_copy is not None and [len(p) for p in child.host_copy.kv] == [12]
    host = tier(cache)
    written, kept = host.write_bytes, host.kept_bytes
    assert host.evict(child)
    cache.check_integrity()
    assert host.write_bytes - written == 1 * KV_TOKEN + child_state
    assert host.kept_bytes - kept == 12 * KV_TOKEN
    assert [len(p) for p in child.kv] == [13]


def test_host_memory_takes_host_entries_before_copies() -> None:
    """Short of host memory, a host entry goes before a copy. Host memory of 2 x ONE: A's
    copy and B's entry fill it; C's demotion evicts B."""
    cache = tiered(hybrid_spec(), 10**4, 2 * ONE)
    a = loaded_back(cache)
    host = tier(cache)
    b, c = (demoted_sequence(cache, first) for first in (200, 600))
    cache.check_integrity()
    assert b.parent is None and c.host and host.dropped_nodes == 1, "B's entry was evicted"
    assert a.host_copy is not None, "the copy outlived it"


def test_with_no_host_entry_left_the_copy_goes() -> None:
    """Host memory of ONE holds A's copy alone: B's demotion takes its room."""
    cache = tiered(hybrid_spec(), 10**4, ONE)
    a = loaded_back(cache)
    host = tier(cache)
    before = host.write_bytes
    b = demoted_sequence(cache, 200)
    cache.check_integrity()
    assert b.host and host.write_bytes - before == ONE
    assert a.host_copy is None and not host.clean


def demoted_sequence(cache: PrefixCache, first: int) -> Node:
    """Serve 12 tokens from `first` (a fresh root child) and send its node to host."""
    serve(cache, seq(first, 10), seq(first + 50, 2))
    (node,) = [n for n in cache.root.children.values() if n.key.tolist()[0] == first]
    assert tier(cache).evict(node)
    return node


def test_dropping_a_device_node_frees_its_copy() -> None:
    """A leaf the tier does not demote (dead by its device policy) leaves with its copy."""
    cache = tiered(hybrid_spec(), 10**4, 10**4)
    a = loaded_back(cache)
    send_children_down(cache, a)
    host = tier(cache)
    for child in list(a.host_children.values()):
        host.drop_subtree(child)
    host.drop_below(a)
    cache.check_integrity()
    assert a.host_copy is None and not host.clean and host_memory(cache).held_bytes() == 0
