"""`--enable-int8-mamba-checkpoint` with our tree, on SGLang's real CPU pools and its real int8
`MambaCheckpointPool` (tests/mamba_session.py `Session(int8_slots=...)`).

The tree's states must be slots of the checkpoint pool holding exactly SGLang's quantization of
the state they name (`Int8CheckpointStore.quantize`), a hit must name that slot as the
copy-on-write source (SGLang's model runner dequantizes it into the live slot), the live Mamba
pool must hold no tree state, and every slot of both pools keeps exactly one owner.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.mamba_session import Session, expected, load_sg, recur, tokens

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def sg() -> Any:
    return load_sg()


def stored(s: Session, slot: int) -> tuple[Any, Any]:
    """The checkpoint slot's dequantized temporal state and its conv windows."""
    ckpt = s.checkpoints
    index = s.sg.torch.tensor([slot])
    temporal = ckpt.temporal.load(index, s.sg.torch.float32)
    return temporal, [conv[:, slot] for conv in ckpt.conv]


def roundtrip(s: Session, value: float) -> Any:
    """SGLang's int8 quantize then dequantize of a state whose every entry is `value`."""
    from sglang.srt.mem_cache.mamba_checkpoint_pool import Int8CheckpointStore as Store

    torch = s.sg.torch
    shape = s.pool.mamba_pool.mamba_cache.temporal[:, :1].shape
    q, scale = Store.quantize(torch.full(shape, value, dtype=torch.float32))
    return Store.dequantize(q, scale, torch.float32)


def assert_checkpoint_of(s: Session, slot: int, prefix: list[int]) -> None:
    temporal, convs = stored(s, slot)
    value = expected(s.sg, prefix)
    assert s.sg.torch.equal(temporal, roundtrip(s, value))
    for conv in convs:  # the conv windows are kept at their own dtype
        assert bool((conv == value).all())


def test_tree_holds_int8_checkpoints_and_a_hit_resumes_from_their_dequantized_state(
    sg: Any,
) -> None:
    s = Session(sg, int8_slots=4)
    a, out1 = tokens(0, 80), tokens(3, 5)
    s.serve(a, out1)
    end1 = len(a) + len(out1) - 1
    slot = s.state_node(a + out1, end1).state.ids()[0]
    assert_checkpoint_of(s, slot, (a + out1)[:end1])
    assert s.pool.mamba_allocator.available_size() == s.pool.mamba_pool.size  # no live slot
    assert s.checkpoints.available_size() == 3
    s.slots_balance()

    b = tokens(5, 30, base=60)
    second = s.admit(a + out1 + b, 3)
    assert second.prefix_len == end1
    assert int(second.kv.mamba_cow_src_index[0]) == slot  # a checkpoint slot, dequantized
    s.prefill(second, 1)
    live = s.pool.mamba_pool.mamba_cache.temporal[:, int(second.kv.mamba_pool_idx)]
    resumed = recur(roundtrip(s, expected(sg, (a + out1)[:end1]))[:, 0], (a + out1 + b)[end1:])
    assert sg.torch.equal(live, resumed)  # continued from SGLang's dequantized checkpoint
    s.decode_and_finish(second, a + out1 + b, [1, 2, 3])
    assert s.cache.states_admitted == 2
    s.slots_balance()


def test_branch_checkpoint_is_quantized_from_the_live_slot_without_a_fork(sg: Any) -> None:
    s = Session(sg, int8_slots=4)
    a = tokens(0, 100)
    s.serve(a, [1, 2])
    c = a[:70] + tokens(9, 30, base=20)
    req = s.admit(c, 2)
    assert req.mamba_branching_seqlen == 70
    free_live = s.pool.mamba_allocator.available_size()
    s.prefill(req, 5, cut_at=70)
    assert s.pool.mamba_allocator.available_size() == free_live  # nothing forked
    slot = s.state_node(c, 70).state.ids()[0]
    assert_checkpoint_of(s, slot, c[:70])
    s.slots_balance(req)
    s.decode_and_finish(req, c, [5, 6])
    s.slots_balance()
    third = s.admit(a[:70] + tokens(4, 20, base=40), 2)
    assert third.prefix_len == 70 and int(third.kv.mamba_cow_src_index[0]) == slot


def test_a_full_checkpoint_pool_evicts_the_tree_and_repeats_free_their_copy(sg: Any) -> None:
    s = Session(sg, int8_slots=2)
    prompts = [tokens(i, 40, base=30 * i + 1) for i in range(4)]
    for prompt in prompts:
        s.serve(prompt, [1, 2])
        s.slots_balance()
        assert s.cache.memory.held(s.cache.state_type) <= 2
    assert s.state_positions(prompts[-1] + [1]) == [len(prompts[-1]) + 1]  # the newest stays
    before = s.checkpoints.available_size()
    s.serve(prompts[-1], [1, 2])  # the same sequence: the tree has its checkpoint already
    assert s.checkpoints.available_size() == before  # the refused copy went back
    s.slots_balance()


def test_extra_buffer_hands_tracked_states_over_quantized(sg: Any) -> None:
    s = Session(sg, extra_buffer=True, int8_slots=8)
    a = tokens(0, 200)
    hit, _ = s.serve(a, [1, 2, 3])
    assert hit == 0
    s.slots_balance()
    held = [n.state.ids()[0] for n in s.cache.cache.tree.nodes() if n.state is not None]
    assert held and all(1 <= i <= 8 for i in held)
    second = s.admit(a + tokens(2, 20, base=50), 2)
    assert second.prefix_len > 0 and int(second.kv.mamba_cow_src_index[0]) in held
    s.prefill(second, 4)
    s.decode_and_finish(second, a + tokens(2, 20, base=50), [4, 5])
    s.slots_balance()
