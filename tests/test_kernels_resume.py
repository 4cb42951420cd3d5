"""Resume from a captured checkpoint: same outputs and final state as one full prefill.

A small Mamba2 mixer core built from the references (causal-conv1d conv + mamba-ssm chunk scan):
prefill all ``L`` tokens once, capture (conv, SSM) state at ``p`` with our kernels, then prefill
``[p, L)`` from that checkpoint, and decode token ``p`` with ``selective_state_update_ref``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import triton_cpu  # noqa: F401  (interpreter patches before the kernels import triton)

from jenga_sglang.kernels.conv_gather import gather_conv_states
from jenga_sglang.kernels.roll_forward import NO_SOURCE, roll_forward_ssm_states

pytestmark = pytest.mark.exactness

H, P, N, G, K, CHUNK, L = 2, 4, 8, 1, 4, 8, 20
D = H * P + 2 * G * N  # conv channels: x, B, C
TOL = 1e-5


@dataclass
class Mixer:
    w: torch.Tensor  # (D, K) conv weight
    bias: torch.Tensor  # (D,)
    a: torch.Tensor  # (H,)
    dt: torch.Tensor  # (L, H) processed step sizes
    xbc: torch.Tensor  # (L, D) conv inputs


def make_mixer() -> Mixer:
    g = torch.Generator().manual_seed(0)
    return Mixer(
        w=torch.randn(D, K, generator=g) * 0.5,
        bias=torch.randn(D, generator=g) * 0.1,
        a=-(torch.rand(H, generator=g) + 0.5),
        dt=torch.rand(L, H, generator=g) * 0.4 + 0.05,
        xbc=torch.randn(L, D, generator=g),
    )


def prefill(
    m: Mixer, lo: int, conv0: torch.Tensor | None, ssm0: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens [lo, L) from the given states: (y, final ssm state, conv outputs, chunk states)."""
    from causal_conv1d.causal_conv1d_interface import causal_conv1d_ref
    from mamba_ssm.ops.triton.ssd_combined import _mamba_chunk_scan_combined_fwd

    conv_in = m.xbc[lo:].T[None].contiguous()
    init = None if conv0 is None else conv0[None].contiguous()
    u = causal_conv1d_ref(conv_in, m.w, m.bias, initial_states=init, activation="silu")
    u = u[0].T.contiguous()  # (T, D)
    x, b, c = torch.split(u, [H * P, G * N, G * N], dim=-1)
    res = _mamba_chunk_scan_combined_fwd(
        x.reshape(1, -1, H, P), m.dt[None, lo:], m.a, b.reshape(1, -1, G, N),
        c.reshape(1, -1, G, N), CHUNK, initial_states=None if ssm0 is None else ssm0[None],
    )  # fmt: skip
    return res[0][0], res[5][0], u, res[4][0]


def capture(
    m: Mixer, u: torch.Tensor, chunk_states: torch.Tensor, ps: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoints at every p of ``ps`` from the one full prefill, in one launch per kernel."""
    n = len(ps)
    ssm = torch.zeros(n, H, P, N)
    x, b = u[:, : H * P].reshape(L, H, P), u[:, H * P : H * P + G * N].reshape(L, G, N)
    k = [p // CHUNK for p in ps]
    roll_forward_ssm_states(
        chunk_states.float(), torch.tensor([i if i > 0 else NO_SOURCE for i in k]), ssm,
        torch.arange(n), x, m.dt, b, m.a,
        torch.tensor([i * CHUNK for i in k]), torch.tensor([p % CHUNK for p in ps]),
    )  # fmt: skip
    conv = torch.zeros(n, D, K - 1)
    gather_conv_states(m.xbc, conv, torch.arange(n), torch.zeros(n, dtype=torch.int64),
                       torch.tensor(ps))  # fmt: skip
    return conv, ssm


def test_resume_from_checkpoint_equals_full_prefill() -> None:
    m = make_mixer()
    y_full, final_full, u, chunk_states = prefill(m, 0, None, None)
    ps = [1, 3, 7, 8, 13]
    conv, ssm = capture(m, u, chunk_states, ps)
    for i, p in enumerate(ps):
        y_rest, final_rest, _, _ = prefill(m, p, conv[i], ssm[i])
        assert (y_rest - y_full[p:]).abs().max() <= TOL, p
        assert (final_rest - final_full).abs().max() <= TOL, p


def test_decode_step_from_checkpoint_matches_prefill_output() -> None:
    from causal_conv1d.causal_conv1d_interface import causal_conv1d_update_ref
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update_ref

    m = make_mixer()
    y_full, _, u, chunk_states = prefill(m, 0, None, None)
    ps = [0, 2, 8, 11, 19]
    conv, ssm = capture(m, u, chunk_states, ps)
    _, ssm_next = capture(m, u, chunk_states, [p + 1 for p in ps])
    for i, p in enumerate(ps):
        state = conv[i : i + 1].clone()
        u_p = causal_conv1d_update_ref(m.xbc[p][None], state, m.w, m.bias, activation="silu")
        assert (u_p[0] - u[p]).abs().max() <= TOL, p
        x, b, c = torch.split(u_p, [H * P, G * N, G * N], dim=-1)
        h = ssm[i : i + 1].clone()
        y = selective_state_update_ref(
            h, x.reshape(1, H, P), m.dt[p][None, :, None].expand(1, H, P),
            m.a[:, None, None].expand(H, P, N), b.reshape(1, G, N), c.reshape(1, G, N),
        )  # fmt: skip
        assert (y[0] - y_full[p]).abs().max() <= TOL, p
        assert (h[0] - ssm_next[i]).abs().max() <= TOL, p
