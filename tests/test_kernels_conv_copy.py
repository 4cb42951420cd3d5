"""Conv-state gather against causal-conv1d's references; slot copies inside one byte buffer."""

from __future__ import annotations

import pytest
import torch
import triton_cpu  # noqa: F401  (interpreter patches before the kernels import triton)

from jenga_sglang.kernels.conv_gather import NO_INIT, gather_conv_states
from jenga_sglang.kernels.state_copy import SlotView, copy_slot_pairs, copy_slots, slot_view_of

pytestmark = pytest.mark.exactness

D, K = 12, 4


def _xbc(length: int, seed: int) -> torch.Tensor:
    return torch.randn(length, D, generator=torch.Generator().manual_seed(seed))


def test_conv_state_at_p_equals_causal_conv1d_final_state() -> None:
    from causal_conv1d.causal_conv1d_interface import causal_conv1d_ref

    seqs = [_xbc(20, 1), _xbc(9, 2)]
    packed = torch.cat(seqs)  # varlen: the second request starts at token 20
    asks = [(0, p) for p in (0, 1, 2, 3, 4, 11, 20)] + [(1, p) for p in (0, 2, 9)]
    out = torch.full((len(asks), D, K - 1), float("nan"))
    gather_conv_states(
        packed, out, torch.arange(len(asks)),
        torch.tensor([20 * r for r, _ in asks]), torch.tensor([p for _, p in asks]),
    )  # fmt: skip
    w = torch.randn(D, K)
    for i, (r, p) in enumerate(asks):
        prefix = seqs[r][:p].T[None]  # (1, D, p)
        if p == 0:
            assert out[i].abs().max() == 0
            continue
        _, final = causal_conv1d_ref(prefix, w, return_final_states=True)
        assert torch.equal(out[i], final[0]), (r, p)


def test_resumed_request_reads_older_inputs_from_its_initial_state() -> None:
    from causal_conv1d.causal_conv1d_interface import causal_conv1d_ref

    full = _xbc(14, 3)
    s = 6  # tokens [0, 6) were cached; the prefill covers [6, 14)
    w = torch.randn(D, K)
    _, init = causal_conv1d_ref(full[:s].T[None], w, return_final_states=True)
    pool = torch.zeros(3, D, K - 1)
    pool[2] = init[0]
    out = torch.zeros(4, D, K - 1)
    counts = [0, 1, 2, 8]
    gather_conv_states(
        full[s:], out, torch.arange(4), torch.zeros(4, dtype=torch.int64), torch.tensor(counts),
        init=pool, init_idx=torch.full((4,), 2),
    )  # fmt: skip
    for i, c in enumerate(counts):
        _, ref = causal_conv1d_ref(full[: s + c].T[None], w, return_final_states=True)
        assert torch.equal(out[i], ref[0]), c


def test_conv_update_from_gathered_state_continues_the_convolution() -> None:
    from causal_conv1d.causal_conv1d_interface import causal_conv1d_ref, causal_conv1d_update_ref

    xbc = _xbc(16, 4)
    w, bias = torch.randn(D, K), torch.randn(D)
    y_full = causal_conv1d_ref(xbc.T[None], w, bias, activation="silu")
    ps = [0, 2, 7, 15]
    out = torch.zeros(len(ps), D, K - 1)
    gather_conv_states(
        xbc, out, torch.arange(len(ps)), torch.zeros(len(ps), dtype=torch.int64), torch.tensor(ps)
    )
    for i, p in enumerate(ps):
        state = out[i : i + 1].clone()
        y = causal_conv1d_update_ref(xbc[p][None], state, w, bias, activation="silu")
        assert (y[0] - y_full[0, :, p]).abs().max() <= 1e-6, p


def test_conv_bf16_gather_is_bit_exact() -> None:
    xbc = _xbc(10, 5).to(torch.bfloat16)
    out = torch.zeros(1, D, K - 1, dtype=torch.bfloat16)
    gather_conv_states(xbc, out, torch.tensor([0]), torch.tensor([0]), torch.tensor([7]))
    assert torch.equal(out[0], xbc[4:7].T)


def test_conv_bad_arguments() -> None:
    xbc, out = _xbc(5, 6), torch.zeros(2, D, K - 1)
    one, zero = torch.tensor([1]), torch.tensor([0])
    with pytest.raises(ValueError, match=r"tokens \[0, 6\) not in \[0, 5\)"):
        gather_conv_states(xbc, out, one, zero, torch.tensor([6]))
    with pytest.raises(ValueError, match=r"dst_idx\[0\] = 2 is out of range"):
        gather_conv_states(xbc, out, torch.tensor([2]), zero, one)
    with pytest.raises(ValueError, match="out: expected"):
        gather_conv_states(xbc, torch.zeros(2, D + 1, K - 1), one, zero, one)
    with pytest.raises(ValueError, match=r"init: expected \(slots, 12, 3\)"):
        gather_conv_states(xbc, out, one, zero, one, torch.zeros(1, D, K), zero)
    with pytest.raises(ValueError, match="share storage"):
        gather_conv_states(xbc, out, one, zero, one, out, zero)
    with pytest.raises(ValueError, match=r"init_idx\[0\] = 3 is out of range"):
        gather_conv_states(xbc, out, one, zero, one, torch.zeros(2, D, K - 1), torch.tensor([3]))
    assert NO_INIT == -1 and out.abs().max() == 0


# One Mamba state page per slot: bf16 conv (D x 3) then fp32 temporal (2 x 4 x 8), 8-byte padded;
# KV pages of another type carved from the same buffer after the state pages.
CONV_BYTES, SSM_BYTES, PAGE = D * 3 * 2, 2 * 4 * 8 * 4, 384
KV_PAGE, N_STATE, N_KV = 96, 6, 8


def _buffer() -> tuple[torch.Tensor, list[SlotView]]:
    buf = torch.randint(0, 256, (PAGE * N_STATE + KV_PAGE * N_KV,), dtype=torch.uint8)
    views = [
        SlotView("conv", 0, PAGE, CONV_BYTES, N_STATE, itemsize=2),
        SlotView("temporal", CONV_BYTES, PAGE, SSM_BYTES, N_STATE, itemsize=4),
        SlotView("kv", PAGE * N_STATE, KV_PAGE, KV_PAGE, N_KV, itemsize=2),
    ]
    return buf, views


def _expected(
    buf: torch.Tensor, views: list[SlotView], jobs: list[tuple[int, int, int]]
) -> torch.Tensor:
    want = buf.clone()
    for v, s, d in jobs:
        (a, b), (c, e) = views[v].span(s), views[v].span(d)
        want[c:e] = buf[a:b]
    return want


def test_mixed_dtype_state_and_kv_copies_in_one_launch_are_bit_exact() -> None:
    buf, views = _buffer()
    jobs = [(0, 1, 4), (1, 1, 4), (0, 2, 5), (1, 0, 3), (2, 0, 7), (2, 3, 1), (2, 6, 6)]
    want = _expected(buf, views, jobs)
    copy_slots(buf, views, jobs)
    assert torch.equal(buf, want)  # destinations copied, every other byte untouched


def test_pairs_copy_every_view_and_typed_views_agree() -> None:
    buf, views = _buffer()
    pool = buf[: PAGE * N_STATE].view(N_STATE, PAGE)
    conv = pool[:, :CONV_BYTES].view(torch.bfloat16).view(N_STATE, D, 3)
    ssm = pool[:, CONV_BYTES : CONV_BYTES + SSM_BYTES].view(torch.float32).view(N_STATE, 2, 4, 8)
    derived = [slot_view_of("conv", buf, conv), slot_view_of("temporal", buf, ssm)]
    assert derived == views[:2]
    conv_src, ssm_src = conv[2].clone(), ssm[2].clone()
    copy_slot_pairs(buf, derived, [(2, 0), (2, 5)])
    for d in (0, 5):
        assert torch.equal(conv[d].view(torch.int16), conv_src.view(torch.int16))
        assert torch.equal(ssm[d].view(torch.int32), ssm_src.view(torch.int32))


def test_byte_granular_views_fall_back_to_byte_words() -> None:
    buf = torch.arange(64, dtype=torch.uint8)
    view = SlotView("odd", 1, 7, 5, 8)
    copy_slots(buf, [view], [(0, 0, 3)])
    assert buf[22:27].tolist() == [1, 2, 3, 4, 5] and buf[27] == 27


@pytest.mark.parametrize(
    ("view", "jobs", "message"),
    [
        (SlotView("t", 2, PAGE, SSM_BYTES, 2, itemsize=4), [(0, 0, 1)], "base=2 is not aligned"),
        (SlotView("t", 0, 100, 120, 4, itemsize=4), [(0, 0, 1)], "slots overlap"),
        (SlotView("t", 0, PAGE, PAGE, 99), [(0, 0, 1)], "last slot ends at byte"),
        (
            SlotView("t", 0, PAGE, 64, 4),
            [(0, 0, 4)],
            r"jobs\[0\]: dst slot 4 of view 't' is out of range \[0, 4\)",
        ),
        (SlotView("t", 0, PAGE, 64, 4), [(0, -1, 2)], r"src slot -1 of view 't'"),
        (SlotView("t", 0, PAGE, 64, 4), [(1, 0, 2)], r"jobs\[0\]: view 1 is out of range \[0, 1\)"),
        (SlotView("t", 0, PAGE, 64, 4), [(0, 0, 2), (0, 1, 2)], "overlap"),
        (SlotView("t", 0, PAGE, 64, 4), [(0, 0, 2), (0, 2, 3)], "overlap"),
    ],
)
def test_copy_rejects_bad_views_and_jobs(
    view: SlotView, jobs: list[tuple[int, int, int]], message: str
) -> None:
    buf, _ = _buffer()
    before = buf.clone()
    with pytest.raises(ValueError, match=message):
        copy_slots(buf, [view], jobs)
    assert torch.equal(buf, before)


def test_overlap_between_different_views_is_rejected() -> None:
    buf, views = _buffer()
    wide = SlotView("wide", 0, PAGE, PAGE, N_STATE, itemsize=4)
    with pytest.raises(ValueError, match="overlap"):
        copy_slots(buf, [*views, wide], [(0, 0, 1), (3, 1, 2)])
