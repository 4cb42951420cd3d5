"""Conv-state gather at exact positions against causal-conv1d's references."""

from __future__ import annotations

import pytest
import torch
import triton_cpu  # noqa: F401  (interpreter patches before the kernels import triton)

from jenga_sglang.kernels.conv_gather import NO_INIT, gather_conv_states

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


def test_checked_launch_may_gather_within_the_live_pool() -> None:
    """In-pass capture reads a row's older inputs from its live slot and writes the capture
    into another slot of the same pool tensor (the caller checked they are distinct)."""
    xbc = _xbc(6, 7)
    pool = torch.randn(4, D, K - 1)
    before = pool.clone()
    dst, start, count, init = (torch.tensor([v]) for v in (3, 0, 2, 1))
    gather_conv_states(xbc, pool, dst, start, count, pool, init, checked=True)
    # State after 2 of this prefill's tokens: the last of slot 1's inputs, then tokens 0 and 1.
    assert torch.equal(pool[3], torch.cat([before[1][:, 2:], xbc[:2].T], dim=1))
    assert torch.equal(pool[:3], before[:3])
