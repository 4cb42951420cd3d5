"""Exactness of the SSM roll-forward kernel against independent references (Triton interpreter).

The state captured at ``p`` during a longer prefill (chunk-boundary state of the long scan, rolled
forward by ``p - c`` tokens) must equal the state of prefilling ``[0, p)`` alone.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import triton_cpu

from jenga_sglang.kernels.roll_forward import NO_SOURCE, DtProcessing, roll_forward_ssm_states

pytestmark = pytest.mark.exactness

H, P, N, G, CHUNK = 4, 8, 16, 2, 8
L = 24
# Positions at, just before and after chunk boundaries, below the conv width, zero, and the end.
POSITIONS = [0, 1, 3, 7, 8, 9, 15, 16, 17, 20, 23, 24]
FP32_TOL = 1e-5
# Rows of the first test compared with a separate mamba-ssm prefill: p = 0, 1, 3 (< K), 7, 8, 9
# (around a boundary), 20 (mid chunk) and 24 (the end); the sequential check covers every row.
PREFIX_SCAN_ROWS = {0, 1, 2, 3, 4, 5, 9, 11}


@dataclass
class Seq:
    """One request's Mamba2 scan inputs (batch dim 1, as the references take them)."""

    x: torch.Tensor  # (1, L, H, P)
    dt: torch.Tensor  # (1, L, H), already processed (positive step sizes)
    b: torch.Tensor  # (1, L, G, N)
    c: torch.Tensor  # (1, L, G, N)


@functools.cache
def make_seq(length: int, dtype: torch.dtype, seed: int) -> Seq:
    """Cached: tests must not modify the returned tensors."""
    g = torch.Generator().manual_seed(seed)
    return Seq(
        x=torch.randn(1, length, H, P, generator=g).to(dtype),
        dt=(torch.rand(1, length, H, generator=g) * 0.4 + 0.05).to(dtype),
        b=torch.randn(1, length, G, N, generator=g).to(dtype),
        c=torch.randn(1, length, G, N, generator=g).to(dtype),
    )


def make_a(seed: int = 7) -> torch.Tensor:
    return -(torch.rand(H, generator=torch.Generator().manual_seed(seed)) + 0.5)


def sequential_states(seq: Seq, a: torch.Tensor) -> torch.Tensor:
    """Plain fp64 recurrence; returns the state after every prefix: (L + 1, H, P, N)."""
    x, dt, b = (t[0].double() for t in (seq.x, seq.dt, seq.b))
    b = b.repeat_interleave(H // G, dim=1)  # (L, H, N)
    h = torch.zeros(H, P, N, dtype=torch.float64)
    out = [h.clone()]
    for t in range(x.shape[0]):
        decay = torch.exp(dt[t] * a.double())[:, None, None]
        h = decay * h + (dt[t][:, None] * x[t])[:, :, None] * b[t][:, None, :]
        out.append(h.clone())
    return torch.stack(out)


_SCANS: dict[tuple[int, int, bool], tuple[torch.Tensor, torch.Tensor]] = {}


def scan_fwd(
    seq: Seq, a: torch.Tensor, upto: int | None = None, **kw: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """mamba-ssm's chunked scan over ``[0, upto)``: (states entering each chunk, final state).

    Results are memoised (the interpreter takes seconds per scan); bf16 inputs are scanned as
    fp32 values because mamba-ssm's bf16 scan returns garbage under the interpreter.
    """
    from mamba_ssm.ops.triton.ssd_combined import _mamba_chunk_scan_combined_fwd

    upto = seq.x.shape[1] if upto is None else upto
    key = (id(seq), upto, bool(kw))
    if key not in _SCANS:
        cut = [t[:, :upto].float() for t in (seq.x, seq.dt, seq.b, seq.c)]
        res = _mamba_chunk_scan_combined_fwd(*cut[:2], a, *cut[2:], CHUNK, **kw)
        _SCANS[key] = (res[4][0].float(), res[5][0].float())
    return _SCANS[key]


def prefix_final_state(seq: Seq, a: torch.Tensor, p: int) -> torch.Tensor:
    """mamba-ssm scan over [0, p) alone; its final state."""
    if p == 0:
        return torch.zeros(H, P, N)
    return scan_fwd(seq, a, p)[1]


def roll_all(
    seqs: list[Seq], a: torch.Tensor, positions: list[list[int]], proc: DtProcessing | None = None
) -> torch.Tensor:
    """One launch: every (request, p) rolled from its long-prefill chunk state over packed inputs.

    Requests are packed back to back (varlen) as the prefill sees them. Returns (R, H, P, N).
    """
    chunk_states, src, starts, counts = [], [], [], []
    offset = 0
    for seq, ps in zip(seqs, positions, strict=True):
        states, _ = scan_fwd(seq, a, **_proc_kwargs(proc))
        for p in ps:
            c = (p // CHUNK) * CHUNK
            # The scan's states[k] is the state entering chunk k; at p == L it is the final chunk.
            k = c // CHUNK
            if k < states.shape[0]:
                src.append(len(chunk_states) if k > 0 else NO_SOURCE)
                chunk_states.append(states[k])
            else:
                src.append(len(chunk_states))
                chunk_states.append(_state_after(seq, a, c, proc))
            starts.append(offset + c)
            counts.append(p - c)
        offset += seq.x.shape[1]
    packed = [torch.cat([getattr(s, f)[0] for s in seqs]) for f in ("x", "dt", "b")]
    out = torch.full((len(src), H, P, N), float("nan"))
    roll_forward_ssm_states(
        torch.stack(chunk_states),
        torch.tensor(src),
        out,
        torch.arange(len(src)),
        packed[0],
        packed[1],
        packed[2],
        a,
        torch.tensor(starts),
        torch.tensor(counts),
        proc,
    )
    return out


def _proc_kwargs(proc: DtProcessing | None) -> dict[str, Any]:
    if proc is None:
        return {}
    return {
        "dt_bias": proc.dt_bias,
        "dt_softplus": proc.softplus,
        "dt_limit": (proc.dt_min, proc.dt_max),
    }


def _state_after(seq: Seq, a: torch.Tensor, c: int, proc: DtProcessing | None) -> torch.Tensor:
    return scan_fwd(seq, a, c, **_proc_kwargs(proc))[1]


def test_fp32_matches_prefix_prefill_and_sequential_recurrence() -> None:
    a = make_a()
    seqs = [make_seq(L, torch.float32, 1), make_seq(19, torch.float32, 2)]
    pos = [POSITIONS, [0, 2, 8, 11, 16, 19]]
    got = roll_all(seqs, a, pos)
    row = 0
    for seq, ps in zip(seqs, pos, strict=True):
        exact = sequential_states(seq, a)
        for p in ps:
            if row in PREFIX_SCAN_ROWS:  # each interpreted scan costs seconds: a subset
                assert (got[row] - prefix_final_state(seq, a, p)).abs().max() <= FP32_TOL, p
            assert (got[row].double() - exact[p]).abs().max() <= FP32_TOL, p
            row += 1


def test_fp32_matches_ssd_minimal_discrete() -> None:
    from mamba_ssm.modules.ssd_minimal import ssd_minimal_discrete

    a = make_a()
    seq = make_seq(L, torch.float32, 3)
    got = roll_all([seq], a, [POSITIONS])
    for i, p in enumerate(POSITIONS):
        if p == 0:
            assert got[i].abs().max() == 0
            continue
        # ssd_minimal takes X*dt and A*dt; pad to a whole block with zero steps (state unchanged).
        block = 8
        pad = (-p) % block
        xdt = torch.nn.functional.pad(seq.x[:, :p] * seq.dt[:, :p, :, None], (0, 0, 0, 0, 0, pad))
        adt = torch.nn.functional.pad(seq.dt[:, :p] * a, (0, 0, 0, pad))
        bh = torch.nn.functional.pad(
            seq.b[:, :p].repeat_interleave(H // G, 2), (0, 0, 0, 0, 0, pad)
        )
        _, final = ssd_minimal_discrete(xdt, adt, bh, bh, block)
        assert (got[i] - final[0]).abs().max() <= FP32_TOL, p


def test_fp32_matches_varlen_states_of_the_long_scan() -> None:
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    a = make_a()
    seq = make_seq(L, torch.float32, 4)
    inner = [3, 9]
    got = roll_all([seq], a, [inner])
    for i, p in enumerate(inner):
        cu = torch.tensor([0, p, L], dtype=torch.int32)
        res = mamba_chunk_scan_combined(
            seq.x, seq.dt, a, seq.b, seq.c, CHUNK, cu_seqlens=cu, return_varlen_states=True
        )
        assert (got[i] - res[1][0]).abs().max() <= FP32_TOL, p


def test_dt_bias_softplus_and_limit_follow_the_scan() -> None:
    a = make_a()
    base = make_seq(L, torch.float32, 5)
    seq = Seq(base.x, base.dt * 6 - 3, base.b, base.c)  # raw dt, both signs
    bias = torch.linspace(-1.0, 1.0, H)
    proc = DtProcessing(dt_bias=bias, softplus=True, dt_min=0.01, dt_max=0.9)
    ps = [0, 5, 8, 13, 23]
    got = roll_all([seq], a, [ps], proc)
    for i, p in enumerate(ps):
        ref = torch.zeros(H, P, N) if p == 0 else _state_after(seq, a, p, proc)
        assert (got[i] - ref).abs().max() <= FP32_TOL, p


def test_bf16_inputs_fp32_state_error_is_small() -> None:
    a = make_a()
    seq = make_seq(L, torch.bfloat16, 6)
    got = roll_all([seq], a, [POSITIONS])
    exact = sequential_states(seq, a)
    errs = {p: float((got[i].double() - exact[p]).abs().max()) for i, p in enumerate(POSITIONS)}
    # Same bf16 inputs, fp32 accumulation: only fp32 rounding separates us from fp64.
    assert max(errs.values()) <= 1e-4, errs


def test_bf16_state_storage() -> None:
    a = make_a()
    seq = make_seq(L, torch.float32, 8)
    states, _ = scan_fwd(seq, a)
    out = torch.zeros(2, H, P, N, dtype=torch.bfloat16)
    roll_forward_ssm_states(
        states.to(torch.bfloat16), torch.tensor([1, 2]), out, torch.tensor([1, 0]),
        seq.x[0], seq.dt[0], seq.b[0], a, torch.tensor([8, 16]), torch.tensor([7, 1]),
    )  # fmt: skip
    exact = sequential_states(seq, a)
    assert (out[1].double() - exact[15]).abs().max() <= 0.05 * exact[15].abs().max()
    assert (out[0].double() - exact[17]).abs().max() <= 0.05 * exact[17].abs().max()


def test_in_place_on_state_slots() -> None:
    a = make_a()
    seq = make_seq(20, torch.float32, 9)
    pool = torch.zeros(3, H, P, N)
    pool[2] = torch.randn(H, P, N)
    start = pool[2].clone()
    roll_forward_ssm_states(
        pool, torch.tensor([2]), pool, torch.tensor([2]),
        seq.x[0], seq.dt[0], seq.b[0], a, torch.tensor([0]), torch.tensor([20]),
    )  # fmt: skip
    ref = start.double()
    x, dt, b = seq.x[0].double(), seq.dt[0].double(), seq.b[0].double().repeat_interleave(2, 1)
    for t in range(20):
        ref = torch.exp(dt[t] * a.double())[:, None, None] * ref
        ref = ref + (dt[t][:, None] * x[t])[:, :, None] * b[t][:, None, :]
    assert (pool[2].double() - ref).abs().max() <= FP32_TOL
    assert pool[:2].abs().max() == 0


def test_matches_sglang_tracked_and_intermediate_states() -> None:
    if not triton_cpu.have("sglang"):
        pytest.skip("sglang is not installed")
    from sglang.kernels.ops.mamba.triton_ops.ssd_combined import mamba_chunk_scan_combined

    a = make_a()
    seq = make_seq(L, torch.float32, 10)
    inner = [1, 3, 7, 8, 9, 17, 23]
    ends = torch.tensor(inner)
    chunk_states, _, tracked = mamba_chunk_scan_combined(
        seq.x, seq.dt, a, seq.b, seq.c, CHUNK,
        seq_idx=torch.zeros(1, L, dtype=torch.int32),
        cu_seqlens=torch.tensor([0, L], dtype=torch.int32),
        out=torch.empty_like(seq.x),
        return_varlen_states=True, return_track_states=True,
        track_seq_idx=torch.zeros(len(inner), dtype=torch.int64), track_end_locs=ends,
    )  # fmt: skip
    states = chunk_states[0].float()
    src = [p // CHUNK if p >= CHUNK else NO_SOURCE for p in inner]
    out = torch.zeros(len(inner), H, P, N)
    roll_forward_ssm_states(
        states, torch.tensor(src), out, torch.arange(len(inner)),
        seq.x[0], seq.dt[0], seq.b[0], a,
        torch.tensor([(p // CHUNK) * CHUNK for p in inner]),
        torch.tensor([p % CHUNK for p in inner]),
    )  # fmt: skip
    assert (out - tracked[0].float()).abs().max() <= FP32_TOL


def _args() -> dict[str, Any]:
    a = make_a()
    seq = make_seq(10, torch.float32, 11)
    return {
        "state_in": torch.zeros(2, H, P, N),
        "src_idx": torch.tensor([0]),
        "state_out": torch.zeros(2, H, P, N),
        "dst_idx": torch.tensor([1]),
        "x": seq.x[0],
        "dt": seq.dt[0],
        "b": seq.b[0],
        "a": a,
        "tok_start": torch.tensor([2]),
        "n_tok": torch.tensor([5]),
    }


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("state_out", torch.zeros(2, H + 1, P, N), "state_out: expected shape"),
        ("a", torch.zeros(H + 1), "A: expected shape"),
        ("b", torch.zeros(10, 3, N), "nheads=4 % ngroups=3"),
        ("dst_idx", torch.tensor([2]), r"dst_idx\[0\] = 2 is out of range \[0, 2\)"),
        ("src_idx", torch.tensor([-2]), r"src_idx\[0\] = -2 is out of range"),
        ("n_tok", torch.tensor([9]), r"tokens \[2, 11\) not in \[0, 10\)"),
        ("tok_start", torch.tensor([0.0]), "int32/int64"),
        ("dst_idx", torch.tensor([1, 1]), "expected 1 entries"),
    ],
)
def test_bad_arguments_raise_before_launch(field: str, value: torch.Tensor, message: str) -> None:
    args = _args()
    args[field] = value
    with pytest.raises(ValueError, match=message):
        roll_forward_ssm_states(**args)
    assert args["state_out"].abs().max() == 0


def test_duplicate_destinations_and_in_place_clash_raise() -> None:
    args = _args()
    for k in ("src_idx", "dst_idx", "tok_start", "n_tok"):
        args[k] = torch.cat([args[k], args[k]])
    with pytest.raises(ValueError, match="both name slot 1"):
        roll_forward_ssm_states(**args)
    args.update(
        state_out=args["state_in"], src_idx=torch.tensor([0, 1]), dst_idx=torch.tensor([1, 0])
    )
    with pytest.raises(ValueError, match="is read as src_idx"):
        roll_forward_ssm_states(**args)
