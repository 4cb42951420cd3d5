"""The live host tier (`--jenga-host-gb`) on SGLang's real CPU pools, driven as the scheduler
drives a request (tests/mamba_session.py): a small Mamba pool pushes a session's checkpoint out
of the device, the tier moves it (with its KV) to host memory, and the session's next turn is
admitted with the hit loaded back into fresh device slots, bytes equal to what was demoted.

The emulated forward writes each state as a recurrence of its prefix (h <- h / 2 + t), and the
KV writes here put each token's id into every layer's K and V rows, so equal bytes after the
round trip mean the right prefix's state and the right tokens' KV, not merely some bytes.
"""

from __future__ import annotations

import pickle
from array import array
from typing import Any

import pytest

from jenga_sglang.binding.host.copies import DetachedCopies, SglangHostCopies
from jenga_sglang.binding.host.memory import HostSlotMemory
from jenga_sglang.binding.options import JengaOptions
from jenga_sglang.radix.pages import OutOfMemory
from tests.admission import flush_cache
from tests.mamba_session import Session, expected, load_sg, recur, tokens
from tests.test_binding_int8_checkpoints import assert_checkpoint_of, roundtrip

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def sg() -> Any:
    return load_sg()


class KvSession(Session):
    """A session whose KV writes put each token's id into its slots, every layer."""

    def _alloc_kv(self, req: Any, start: int, end: int) -> None:
        super()._alloc_kv(req, start, end)
        loc = self.pool.req_to_token[req.kv.req_pool_idx, start:end].to(self.sg.torch.int64)
        ids = list(req.origin_input_ids) + list(req.output_ids)
        values = self.sg.torch.tensor([float(ids[i]) for i in range(start, min(end, len(ids)))])
        for buffer in kv_buffers(self):
            buffer[loc[: len(values)]] = values.to(buffer.dtype)[:, None, None]

    def kv_at(self, req: Any, stop: int) -> list[float]:
        """Token ids the K rows of the request's hit [0, stop) hold, as the scheduler reads
        its prefix slots off the tree (`prefix_device_indices`), the same in every layer."""
        loc = self.cache.path_device_indices(req.last_node, 0, stop).to(self.sg.torch.int64)
        assert len(loc) == stop
        rows = kv_buffers(self)[0][loc]
        for buffer in kv_buffers(self)[1:]:
            assert bool((buffer[loc] == rows).all()), "layers disagree"
        return [float(v) for v in rows[:, 0, 0]]


def kv_buffers(s: Session) -> list[Any]:
    pool = s.alloc.get_kvcache().full_kv_pool
    return [*pool.k_buffer, *pool.v_buffer]


def tiered(sg: Any, **fields: Any) -> KvSession:
    """A session with 50 GB of host memory over a 100 GB/s link: Nemotron-H-8B's 102 MB
    checkpoint at 100 tokens then loads faster than it recomputes at the default 494.5
    TFLOP/s (1.0 against 2.9 ms; at 25 GB/s, 4.1 ms, it would not, and would be dropped), and 300 KV
    slots, so KV is evicted too."""
    return KvSession(
        sg, admission="jenga", prompt_end=True, host_gb=50.0, host_bw=100.0, kv_size=300, **fields
    )


def session_pushed_to_host(s: Session) -> list[int]:
    """Serve a first session's turn (100 prompt tokens, 6 reply tokens), then 8 others, which
    push it out of the device; its history."""
    first_in, first_out = tokens(0, 100), tokens(3, 6)
    s.serve(first_in, first_out)
    fill_with_others(s, 8)
    return first_in + first_out


def fill_with_others(s: Session, count: int) -> None:
    """Serve `count` unrelated requests (their own token bases): each leaves a state behind."""
    for k in range(count):
        s.serve(tokens(0, 40, base=20 + 5 * k), tokens(1, 4, base=20 + 5 * k))


def test_a_demoted_session_turn_is_loaded_back_with_its_bytes(sg: Any) -> None:
    s = tiered(sg)
    host = s.cache.host
    assert host is not None
    history = session_pushed_to_host(s)  # six Mamba slots: the first session's state leaves
    s.cache.sanity_check()
    assert host.demoted_nodes + host.demoted_states > 0
    assert not any(n.state is not None for n in s.cache.cache.tree.nodes() if n.end == 105)
    assert s.cache.host_hit_tokens == 0
    req = s.admit(history + tokens(5, 12), 4)
    hit = int(req.prefix_len)
    assert hit >= 100  # the prompt-end state at 100, or the decoded end at 105
    assert s.cache.host_hit_tokens > 0
    src = req.kv.mamba_cow_src_index
    assert src is not None and s.read(int(src[0])) == expected(sg, history[:hit])
    assert s.kv_at(req, hit) == [float(t) for t in history[:hit]]
    snap = s.cache.snapshot()
    assert snap.host_hit_tokens == s.cache.host_hit_tokens
    assert snap.host_loaded_bytes > 0 and snap.host_stored_bytes >= snap.host_loaded_bytes
    s.prefill(req, 7)
    s.decode_and_finish(req, history + tokens(5, 12), [7, 8, 9, 10])
    s.cache.sanity_check()
    s.slots_balance()


def test_a_second_demotion_onto_the_clean_copy_stores_less_and_loads_the_same_bytes(
    sg: Any,
) -> None:
    """The turn loaded back keeps its host ids (radix/host_copy.py). Pushed out again, the
    tier demotes onto them: what the copy holds is not stored again, the turn's new tokens
    are, so the node's pages lie in two host blocks, and the next load reads both."""
    s = tiered(sg)
    host = s.cache.host
    assert host is not None
    turn = session_pushed_to_host(s) + tokens(5, 12)
    req = s.admit(turn, 4)
    assert int(req.prefix_len) >= 100 and s.cache.host_hit_tokens > 0
    assert host.clean, "the load left its host pages as a clean copy"
    s.prefill(req, 7)
    s.decode_and_finish(req, turn, [7, 8, 9, 10])
    s.cache.sanity_check()
    copies = host.copies
    assert isinstance(copies, SglangHostCopies)
    stored, kept = copies.stored_bytes, host.kept_bytes
    fill_with_others(s, 8)  # the turn's nodes go down again
    s.cache.sanity_check()
    assert host.kept_bytes > kept, "demoted onto the copy: bytes not copied again"
    assert s.cache.snapshot().host_kept_bytes == host.kept_bytes
    history = [*turn, 7, 8, 9, 10]
    again = s.admit(history + tokens(9, 3), 4)
    hit = int(again.prefix_len)
    assert hit >= len(turn), "the hit reaches the turn's prompt end, past the first load"
    src = again.kv.mamba_cow_src_index
    assert src is not None and s.read(int(src[0])) == expected(sg, history[:hit])
    assert s.kv_at(again, hit) == [float(t) for t in history[:hit]]
    assert copies.stored_bytes > stored, "the turn's new tokens were stored"
    s.prefill(again, 7)
    s.decode_and_finish(again, history + tokens(9, 3), [7, 8])
    s.cache.sanity_check()
    s.slots_balance()


@pytest.mark.parametrize("leaves", ["aborted in prefill", "retracted in decode"])
def test_a_request_that_leaves_after_its_load_gives_everything_back(sg: Any, leaves: str) -> None:
    """A turn whose hit came back from host memory is aborted once its prefill is scheduled,
    or retracted after two decode steps (SGLang's `release_kv_cache` without a checkpoint):
    its slots go back, the loaded hit stays in the tree, and the same turn then hits on the
    device with the demoted bytes (the tier's ids and blocks are checked by sanity_check)."""
    s = tiered(sg)
    history = session_pushed_to_host(s)
    turn = history + tokens(5, 12)
    req = s.admit(turn, 4)
    hit = int(req.prefix_len)
    assert hit >= 100 and s.cache.host_hit_tokens > 0
    if leaves == "aborted in prefill":
        s._alloc_kv(req, hit, len(turn))
        req.finished_reason = sg.FINISH_LENGTH(length=0)
    else:
        s.prefill(req, 7)
        s._alloc_kv(req, len(turn), len(turn) + 2)
        for k, token in enumerate((7, 8)):
            s._decode_step(req, token, len(turn) + k + 1)
            req.output_ids.append(token + 1)
    sg.release_kv_cache(req, s.cache, checkpoint=False)
    assert not req.kv.holds_mamba
    s.cache.sanity_check()
    s.slots_balance()
    loaded = s.cache.host_hit_tokens
    again = s.admit(turn, 4)
    assert int(again.prefix_len) == hit and s.cache.host_hit_tokens == loaded  # device now
    src = again.kv.mamba_cow_src_index
    assert src is not None and s.read(int(src[0])) == expected(sg, turn[:hit])
    assert s.kv_at(again, hit) == [float(t) for t in turn[:hit]]
    s.prefill(again, 7)
    s.decode_and_finish(again, turn, [7, 8])
    s.cache.sanity_check()
    s.slots_balance()


def test_without_the_flag_the_same_turn_misses(sg: Any) -> None:
    """The baseline of the test above: the same load with no tier recomputes the session."""
    s = KvSession(sg, admission="jenga", prompt_end=True, kv_size=300)
    assert s.cache.host is None
    hit, _ = s.serve(session_pushed_to_host(s) + tokens(5, 20), [1, 2])
    assert hit == 0


def test_a_ratio_sizes_the_tier_from_the_device_pools_bytes(sg: Any) -> None:
    """`--enable-hierarchical-cache --hicache-ratio R` (binding/plugin.py): host memory is R
    times the device bytes behind the cache's pools, the KV buffers and the Mamba states."""
    from jenga_sglang.binding.host.copies import kv_buffers
    from jenga_sglang.binding.host.tier import device_pool_bytes

    s = KvSession(sg, admission="jenga", prompt_end=True, kv_size=300, host_ratio=1.5)
    assert s.cache.host is not None
    kv = s.alloc.get_kvcache()
    full, state = kv.full_kv_pool, s.pool.mamba_pool.mamba_cache  # a hybrid model's pools
    want = sum(t.numel() * t.element_size() for t in (*full.k_buffer, *full.v_buffer))
    want += sum(t.numel() * t.element_size() for t in (*state.conv, state.temporal))
    buffers = kv_buffers(kv, s.cache.slots.kv_type, None)
    assert device_pool_bytes(buffers, s.pool) == want  # separate pools: every buffer counted
    assert s.cache.host.memory.capacity_bytes == int(1.5 * want)


def test_a_match_reports_the_host_hit_and_only_admission_loads_it(sg: Any) -> None:
    """Probes and the match a waiting request gets each round (cow_mamba on) report what the
    tier offers past the device hit as SGLang's `host_hit_length` and move nothing, so a
    request PrefillAdder refuses loads nothing; its `init_load_back`, once admitted, loads
    exactly the promised tokens."""
    from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    s = tiered(sg)
    history = session_pushed_to_host(s)
    host = s.cache.host
    assert host is not None
    on_host = len(host.host_nodes())
    probe = s.cache.match_prefix(
        MatchPrefixParams(key=RadixKey(history), cow_mamba=False, req=None)
    )
    assert probe.device_prefix_len == 0 and len(host.host_nodes()) == on_host
    turn = history + tokens(5, 12)
    req = sg.Req(
        rid="waits", origin_input_text="", origin_input_ids=array("q", turn),
        sampling_params=sg.SamplingParams(temperature=0, max_new_tokens=4),
    )  # fmt: skip
    for _ in range(3):  # three rounds in the waiting queue, refused by the budget each time
        req.init_next_round_input(s.cache)
        assert req.prefix_len == 0 and req.host_hit_length >= 100 and req.mamba_host_hit_length
        assert len(host.host_nodes()) == on_host and s.cache.host_hit_tokens == 0
    pin = s.cache.lock(req.last_node)
    loaded = s.cache.init_load_back(
        InitLoadBackParams(req.best_match_node, req.host_hit_length, req=req)
    )
    s.cache.unlock(pin)
    assert loaded is not None and loaded[0] == req.host_hit_length == s.cache.host_hit_tokens
    assert s.state_node(turn, loaded[0]).state is not None  # back on the device
    src = req.kv.mamba_cow_src_index
    assert src is not None and s.read(int(src[0])) == expected(sg, turn[: loaded[0]])
    s.pool.free_mamba_cache(req)
    s.cache.sanity_check()


class NoRoomForTheState:
    """This pass's admission budget as `init_load_back` reads it (binding/pools/budget.py
    `SharedPoolBudget.fits_loaded_state`): the checkpoint the load brings does not fit."""

    def __init__(self) -> None:
        self.asked = 0

    def fits_loaded_state(self) -> bool:
        self.asked += 1
        return False


def test_a_load_whose_state_does_not_fit_loads_nothing_and_serves_the_device_hit(
    sg: Any,
) -> None:
    """Where the pass's budget says the checkpoint of an admitted request's host hit would
    take room its admission counted on, `init_load_back` loads none of the promised tokens
    (SGLang's all-or-none) and counts a decline; the request is served from its device hit,
    and its slots balance."""
    s = tiered(sg)
    turn = session_pushed_to_host(s) + tokens(5, 12)
    budget = NoRoomForTheState()
    s.cache.admission_budget = budget
    req = s.admit(turn, 4)  # SGLang's adder: init_load_back on the admitted request
    assert budget.asked == 1 and req.host_hit_length >= 100 and req.host_loaded_length == 0
    assert int(req.prefix_len) < 100 and s.cache.host_hit_tokens == 0
    snap = s.cache.snapshot()
    assert snap.host_loads_declined == 1 and snap.host_loaded_bytes == 0
    s.prefill(req, 7)
    s.decode_and_finish(req, turn, [7, 8, 9, 10])
    s.cache.sanity_check()
    s.slots_balance()


def test_host_memory_reuses_ids_and_frees_bytes_with_their_last_id() -> None:
    from jenga_sglang.radix.pages import PageKind, PageType

    kv, state = PageType(PageKind.KV, 0), PageType(PageKind.STATE, 1)
    memory = HostSlotMemory(1000, {kv: 10, state: 300})
    pages = memory.alloc(kv, 4, 0)
    memory.put(kv, pages, ["rows"])
    memory.mark_evictable(kv, pages)
    head, tail = pages.split(1)
    ((data, rows, where),) = memory.runs(kv, tail)
    assert data == ["rows"] and rows.tolist() == [1, 2, 3] and where.tolist() == [0, 1, 2]
    other = memory.alloc(kv, 2, 0)  # a second block: a node demoted onto a clean copy
    memory.put(kv, other, ["other"])
    memory.mark_evictable(kv, other)
    runs = memory.runs(kv, other.concat(tail))
    assert [(d, r.tolist(), w.tolist()) for d, r, w in sorted(runs, key=lambda x: x[0])] == [
        (["other"], [0, 1], [0, 1]),
        (["rows"], [1, 2, 3], [2, 3, 4]),
    ]
    memory.free_evictable(kv, other)
    memory.free_evictable(kv, head)
    memory.check_integrity()
    memory.free_evictable(kv, tail)
    memory.check_integrity()
    assert memory.held_bytes() == 0 and not memory._blocks
    again = memory.alloc(kv, 2, 0)
    assert set(again.ids()) <= {0, 1, 2, 3}  # freed ids come back
    with pytest.raises(OutOfMemory, match="exceed"):
        memory.alloc(state, 4, 0)  # 1,200 bytes in a 1,000-byte budget
    memory.put(kv, again, ["more"])
    copy = pickle.loads(pickle.dumps(memory))
    assert copy.detached and copy.held(kv) == 2
    copy.check_integrity()
    with pytest.raises(RuntimeError, match="detached"):
        copy.runs(kv, again)


def test_a_pickled_cache_replays_the_tier_without_bytes(sg: Any) -> None:
    """The alpha tuner's copy: the tier's decisions, none of SGLang's pools or host bytes."""
    s = tiered(sg)
    s.serve(tokens(0, 100), tokens(3, 6))
    fill_with_others(s, 8)
    host = s.cache.host
    assert host is not None and isinstance(host.copies, SglangHostCopies)
    copy = pickle.loads(pickle.dumps(s.cache.cache))
    assert isinstance(copy.tree.host.copies, DetachedCopies)
    assert copy.tree.host.memory.detached
    copy.check_integrity()


def test_an_int8_checkpoint_goes_to_host_and_comes_back_as_it_was_quantized(sg: Any) -> None:
    """`--enable-int8-mamba-checkpoint`: the tree's states are slots of SGLang's checkpoint
    pool; a demoted one is copied quantized, and the load-back puts SGLang's quantization of
    the right prefix into a fresh checkpoint slot, which the hit then dequantizes from."""
    s = tiered(sg, int8_slots=4)
    host = s.cache.host
    assert host is not None
    first_in, first_out = tokens(0, 100), tokens(3, 6)
    s.serve(first_in, first_out)
    history = first_in + first_out
    fill_with_others(s, 8)  # four checkpoint slots: the first session's must leave
    s.cache.sanity_check()
    assert host.demoted_states > 0
    assert not any(n.state is not None for n in s.cache.cache.tree.nodes() if n.end >= 100)
    req = s.admit(history + tokens(5, 12), 4)
    hit = int(req.prefix_len)
    assert hit >= 100 and s.cache.host_hit_tokens > 0
    src = int(req.kv.mamba_cow_src_index[0])
    assert 1 <= src <= 4  # a checkpoint slot, not a live one
    assert_checkpoint_of(s, src, history[:hit])
    assert s.kv_at(req, hit) == [float(t) for t in history[:hit]]
    s.prefill(req, 7)
    live = s.pool.mamba_pool.mamba_cache.temporal[:, int(req.kv.mamba_pool_idx)]
    ids = history + tokens(5, 12)
    assert sg.torch.equal(live, recur(roundtrip(s, expected(sg, history[:hit]))[:, 0], ids[hit:]))
    s.decode_and_finish(req, ids, [7, 8, 9, 10])
    s.cache.sanity_check()
    s.slots_balance()


def test_options_parse_the_host_flags() -> None:
    import argparse

    from jenga_sglang.binding.options import (
        JengaFlagError,
        add_jenga_args,
        check_conflicts,
        options_from_namespace,
    )

    parser = argparse.ArgumentParser()
    add_jenga_args(parser)
    args = parser.parse_args(["--enable-jenga", "--jenga-host-gb", "32", "--jenga-host-bw", "50"])
    options = options_from_namespace(args)
    assert (options.host_gb, options.host_bw) == (32.0, 50.0)
    assert options.prefill_tflops == JengaOptions.prefill_tflops
    with pytest.raises(SystemExit):
        parser.parse_args(["--enable-jenga", "--jenga-host-bw", "0"])
    with pytest.raises(JengaFlagError, match="--jenga-host-gb given without --enable-jenga"):
        check_conflicts(parser.parse_args(["--jenga-host-gb", "4"]))


def test_kv_events_follow_a_state_to_host_and_back(sg: Any) -> None:
    """A router following the events holds the spans of every checkpoint a hit can use, on
    the device or in host memory: a state demoted to host stays published (the next turn's
    load-back serves it), and after the load the router's prediction is the worker's hit."""
    from test_kv_events import _usable_paths

    from jenga_sglang.bench.drivers.kv_index import BlockIndex
    from jenga_sglang.binding.slots.kv_events import attach, chain_hashes

    s = tiered(sg)
    assert attach(s.cache, True) is not None
    router = BlockIndex(strict=True)

    def synced() -> None:
        router.apply(s.cache.take_events())
        assert router.paths() == _usable_paths(s.cache)
        s.cache.kv_events.check_integrity()

    first_in, first_out = tokens(0, 100), tokens(3, 6)
    s.serve(first_in, first_out)
    synced()
    history = first_in + first_out
    assert router.predicted_hit(history) >= 100
    host = s.cache.host
    assert host is not None
    fill_with_others(s, 8)  # the first session's states leave the device
    assert host.demoted_states > 0
    synced()
    predicted = router.predicted_hit(history + tokens(5, 12))
    assert predicted >= 100  # on host, still a hit: the router keeps it
    deepest = chain_hashes(history[:predicted], s.cache.page_size)[-1]
    assert deepest in router.on("host") and deepest not in router.on("device")
    req = s.admit(history + tokens(5, 12), 4)
    hit = int(req.prefix_len)
    assert s.cache.host_hit_tokens > 0 and hit == predicted
    synced()  # the load-back stored the span on the device again and removed its host copy
    assert deepest in router.on("device") and deepest not in router.on("host")
    assert router.predicted_hit(history + tokens(5, 12)) == hit
    s.prefill(req, 7)
    s.decode_and_finish(req, history + tokens(5, 12), [7, 8, 9, 10])
    synced()


def test_kv_events_remove_a_span_when_its_host_copy_goes(sg: Any) -> None:
    """Host memory for about two checkpoints and their KV: other sessions push the first
    one's demoted state out of host memory too, and only then does the router lose it. After
    every step, and after `/flush_cache`, the router holds exactly the usable spans."""
    from test_kv_events import _usable_paths

    from jenga_sglang.bench.drivers.kv_index import BlockIndex
    from jenga_sglang.binding.slots.kv_events import attach

    s = KvSession(sg, admission="jenga", prompt_end=True, host_gb=0.25, host_bw=100.0, kv_size=300)
    host = s.cache.host
    assert host is not None and attach(s.cache, True) is not None
    router = BlockIndex(strict=True)

    def synced() -> None:
        router.apply(s.cache.take_events())
        assert router.paths() == _usable_paths(s.cache)
        s.cache.kv_events.check_integrity()

    history = tokens(0, 100) + tokens(3, 6)
    s.serve(tokens(0, 100), tokens(3, 6))
    synced()
    kept = []
    for k in range(12):
        s.serve(tokens(0, 40, base=20 + 5 * k), tokens(1, 4, base=20 + 5 * k))
        synced()
        kept.append(router.predicted_hit(history))
    assert host.demoted_states > 0 and host.dropped_states > 0
    assert kept[0] >= 100 and kept[-1] == 0  # on host a while, then gone with its copy
    flush_cache(s.cache, s.pool, s.alloc)
    synced()
    assert not router.blocks and s.cache.kv_events.published() == 0


def test_flush_cache_drops_device_and_host_and_serving_goes_on(sg: Any) -> None:
    """`/flush_cache` raised in the scheduler and took the server down while the tree held
    anything; it now empties the tree, device and host, and the next request is cold."""
    s = tiered(sg)
    host = s.cache.host
    assert host is not None
    history = session_pushed_to_host(s)
    assert host.host_nodes() or any(n.host_state is not None for n in s.cache.cache.nodes())
    flush_cache(s.cache, s.pool, s.alloc)
    assert next(s.cache.cache.nodes(), None) is None and not host.host_nodes()
    assert all(host.memory.usage(t).used + host.memory.usage(t).evictable == 0
               for t in host.memory.page_types)  # fmt: skip
    assert s.cache.evictable_size() == 0 and s.cache.protected_size() == 0
    turn = history + tokens(5, 12)
    hit, _ = s.serve(turn, [7, 8])
    assert hit == 0  # nothing survived the flush
    again, _ = s.serve([*turn, 7, 8, 9], [4])
    assert again >= len(turn)  # and the tree caches again
    s.cache.sanity_check()
