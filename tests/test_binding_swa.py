"""A hybrid-SWA model (gpt-oss's layout) through SGLang's calls on its real CPU pools.

Every request reads, through SGLang's full-to-window slot mapping, the window KV of exactly its
own prefix (tests/swa_session.py checks every position a window layer reads); the tree keeps
window pages only where SGLang's running requests left them or another request brought them
back, and drops out-of-window pages first when the window pool is short.
"""

from __future__ import annotations

import pytest
from swa_session import WINDOW, SwaSession

pytestmark = pytest.mark.sglang


def toks(base: int, n: int) -> list[int]:
    return [base + (7 * i) % 97 for i in range(n)]


@pytest.mark.parametrize(("page", "jenga"), [(1, False), (4, False), (1, True), (4, True)])
def test_turns_and_branches_hit_with_their_window(page: int, jenga: bool) -> None:
    s = SwaSession(page=page, jenga_bytes=8 * 2 * 600 if jenga else None)
    prompt, reply = toks(100, 40), toks(300, 20)  # the reply outgrows the window: its head
    assert s.serve(prompt, reply) == 0  # of KV leaves the window pool while it decodes
    tree = s.cache.cache.tree
    (node,) = tree.root.children.values()
    leaf = next(iter(node.children.values()))
    assert leaf.tombstones[s.cache.slot_tree.window_slot] > 0  # the decode's freed window
    turn2 = [*prompt, *reply[:-1], *toks(500, 10)]
    whole = 59 - 59 % page
    assert s.serve(turn2, toks(600, 3)) == whole  # the end of turn 1 kept its window
    branch = [*prompt[:30], *toks(700, 10)]
    assert s.serve(branch, toks(800, 3)) == 30 - 30 % page  # the prompt kept its window
    # inside the decoded reply the window is gone: back to the prompt's end
    inside = [*prompt, *reply[:12], 1, 2, 3]
    assert s.serve(inside, toks(900, 2)) == 40
    s.check_pools()


def test_a_request_that_recomputes_a_dropped_window_revives_it() -> None:
    s = SwaSession()
    prompt, reply = toks(100, 40), toks(300, 30)
    s.serve(prompt, reply)
    slot = s.cache.slot_tree.window_slot
    # prompt + 20 reply tokens: the window of 60 was freed while turn 1 decoded, so the
    # hit falls back to 40 and this request computes [40, 60) again, window included
    again = [*prompt, *reply[:20]]
    assert s.serve(again, toks(600, 2)) == 40
    (node,) = s.cache.cache.tree.root.children.values()
    upper = next(n for n in node.children.values() if n.end == 60)
    assert upper.tombstones[slot] == 0  # revived: the tree kept this request's window
    assert s.serve([*again, 5, 6], toks(650, 2)) == 60  # and a hit at 60 reads it
    s.check_pools()


def test_a_short_window_pool_trims_before_it_evicts() -> None:
    s = SwaSession(full=2048, swa=96, chunk=32)
    prompts = [toks(1000 * (k + 1), 30) for k in range(6)]
    for p in prompts:  # 6 x 31 window slots > 96: the pool runs short
        assert s.serve(p, toks(50, 2)) == 0
    tree = s.cache.cache.tree
    slot = s.cache.slot_tree.window_slot
    assert tree.evicted_nodes == 0  # full KV all kept: only window pages went
    assert sum(n.tombstones[slot] for n in tree.nodes()) > 0
    trimmed = [n for n in tree.nodes() if n.tombstones[slot]]
    for p in prompts:  # each prompt's end kept its window: every turn 2 hits in full
        assert s.serve([*p, 50, 9], toks(60, 2)) == 31
    # inside a trimmed edge the window is gone: such a hit falls back to the root
    first = trimmed[0].key.tolist()
    assert s.serve([*first[:20], 7, 7], toks(70, 2)) == 0
    s.check_pools()


def test_a_prompt_longer_than_the_window_pool_is_served() -> None:
    """Chunked prefill inserts each chunk's window KV into the tree, on the request's own
    locked path; a window pool smaller than the prompt trims that path behind the window."""
    s = SwaSession(full=2048, swa=96, chunk=32)
    prompt = toks(100, 300)
    assert s.serve(prompt, toks(50, 4)) == 0
    assert s.serve([*prompt, 50, 57, 1], toks(60, 2)) == 302  # its end kept its window
    s.check_pools()


def test_the_jenga_pool_lends_window_bytes_to_full_kv() -> None:
    """On the Jenga pool full and window KV share one buffer: once window pages out of every
    window are trimmed, full KV takes their bytes. SGLang's static split of the same bytes
    (a window pool of 0.8 x the full one) holds fewer full tokens than this tree keeps."""
    budget = 8 * 2 * 300  # bytes: 8 a slot (K and V, one float each)
    static_full = budget // int(8 * 1.8)  # full slots of SGLang's split of the same bytes
    s = SwaSession(jenga_bytes=budget, chunk=32)
    prompts = [toks(1000 * (k + 1), 100) for k in range(4)]
    for p in prompts:
        assert s.serve(p, toks(50, 2)) == 0
    tree = s.cache.cache.tree
    assert tree.evicted_nodes == 0
    held = s.cache.cache.memory.held(s.cache.slots.kv_type)
    assert held == 4 * 101 > static_full
    for p in prompts:  # every prompt's end kept its window: each turn 2 hits in full
        assert s.serve([*p, 50, 9], toks(60, 2)) == 101
    s.check_pools()
    s.alloc.paired.check_integrity()


@pytest.mark.parametrize("page", [1, 4])
def test_sglang_sizes_over_the_jenga_pool_are_in_tokens(page: int) -> None:
    """The configure hook tells SGLang how long one request may grow: what its full KV can
    take beside its window, in tokens at any page size (never clipped to nothing)."""
    from types import SimpleNamespace

    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigResult
    from swa_session import jenga_window_params

    from jenga_sglang.binding.pools.hook import after_configure

    params = jenga_window_params(8 * 2 * 600, page)
    allocator = params.token_to_kv_pool_allocator
    result = KVCacheConfigResult(
        max_total_num_tokens=10**6,
        max_running_requests=4,
        full_max_total_num_tokens=10**6,
        swa_max_total_num_tokens=10**6,
        req_to_token_pool=params.req_to_token_pool,
        token_to_kv_pool=allocator.get_kvcache(),
        token_to_kv_pool_allocator=allocator,
        memory_pool_config=None,
    )
    configurator = SimpleNamespace(model_config=SimpleNamespace(sliding_window_size=WINDOW - 1))
    got = after_configure(result, configurator)
    expected = allocator.paired.most_full(-(-(WINDOW - 1) // page) + 1) * page
    assert got.max_total_num_tokens == expected > 0
    # more than the pairs that fit: one request's window is all the window KV it needs
    assert got.max_total_num_tokens > allocator.available_size()
    assert got.max_total_num_tokens % page == 0
    assert got.full_max_total_num_tokens == allocator.size_full == allocator.size_swa


def test_accepted_draft_kv_moves_over_both_pools_views() -> None:
    """NGRAM over the sliding-window Jenga pool: SGLang's accepted-token move (SWAKVPool's,
    through its full-to-window mapping) copies K and V in our full and window views."""
    import torch
    from swa_session import jenga_window_params

    allocator = jenga_window_params(8 * 2 * 600).token_to_kv_pool_allocator
    kv = allocator.get_kvcache()
    src, dst = allocator.alloc(3), allocator.alloc(3)
    window_src = kv.translate_loc_from_full_to_swa(src)
    for pool, loc, base in ((kv.full_kv_pool, src, 1.0), (kv.swa_kv_pool, window_src, 7.0)):
        pool.k_buffer[0][loc] = base + torch.arange(3.0).view(3, 1, 1)
        pool.v_buffer[0][loc] = -base - torch.arange(3.0).view(3, 1, 1)
    kv.move_kv_cache(dst, src)
    window_dst = kv.translate_loc_from_full_to_swa(dst)
    assert torch.equal(kv.full_kv_pool.k_buffer[0][dst], kv.full_kv_pool.k_buffer[0][src])
    assert torch.equal(kv.full_kv_pool.v_buffer[0][dst], kv.full_kv_pool.v_buffer[0][src])
    assert torch.equal(
        kv.swa_kv_pool.k_buffer[0][window_dst], 7.0 + torch.arange(3.0).view(3, 1, 1)
    )
    assert torch.equal(
        kv.swa_kv_pool.v_buffer[0][window_dst], -7.0 - torch.arange(3.0).view(3, 1, 1)
    )


def test_window_rule_follows_sglang_window() -> None:
    s = SwaSession()
    assert s.cache.supports_swa()
    assert s.cache.sliding_window_size == WINDOW - 1
    assert s.cache.swa_retain_window == WINDOW - 1
    # the tree's window rule is SGLang's: a hit at p needs the WINDOW - 1 tokens before p
    windows = [g.window for g in s.cache.spec.attention_groups if g.window is not None]
    assert windows == [WINDOW - 1]
