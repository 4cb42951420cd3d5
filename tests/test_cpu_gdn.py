"""Gated DeltaNet on CPU (jenga_sglang/cpu_gdn.py): SGLang's own GDN kernels under the Triton
interpreter against the recurrence written out in torch, and a stock server (no --enable-jenga)
on the tiny Qwen3.5 against transformers' forward of the same checkpoint.

The recurrence (SGLang's fused_recurrent kernel's convention; state S is [V, K] per value head,
q and k L2-normalised, key heads shared by HV/H value heads):

    S_t = exp(g_t) S_{t-1};  S_t += beta_t (v_t - S_t k_t) k_t^T;  o_t = scale * S_t q_t

The kernel unit tests take a few seconds each; the server test about 2-3 minutes on 2 cores
(one start, a 200-token prefill under the interpreter, a second turn that resumes from the
state SGLang cached at the end of the first).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
import triton_cpu  # noqa: F401  (interpreter patches before the kernels import triton)

from jenga_sglang import cpu_gdn
from jenga_sglang.bench.drivers.server import LocalServer
from jenga_sglang.bench.drivers.tiny_families import FAMILIES

pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[1]
H, HV, K, V = 2, 4, 16, 16  # the tiny Qwen3.5's linear-attention heads


def _l2(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # the kernels' epsilon


def _recurrence(
    q: torch.Tensor,  # [T, H, K]
    k: torch.Tensor,  # [T, H, K]
    v: torch.Tensor,  # [T, HV, V]
    g: torch.Tensor,  # [T, HV], log decay
    beta: torch.Tensor,  # [T, HV]
    state: torch.Tensor,  # [HV, V, K]
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, token by token, in float64; returns (o [T, HV, V], final state)."""
    rep = v.shape[1] // q.shape[1]
    q = _l2(q.double()).repeat_interleave(rep, 1)
    k = _l2(k.double()).repeat_interleave(rep, 1)
    s = state.double().clone()
    out = []
    for t in range(q.shape[0]):
        s = s * torch.exp(g[t].double())[:, None, None]
        delta = beta[t].double()[:, None] * (v[t].double() - torch.einsum("hvk,hk->hv", s, k[t]))
        s = s + torch.einsum("hv,hk->hvk", delta, k[t])
        out.append(scale * torch.einsum("hvk,hk->hv", s, q[t]))
    return torch.stack(out), s


@pytest.fixture(scope="module")
def gdn_triton() -> Any:
    cpu_gdn.install()
    return importlib.import_module("sglang.srt.layers.attention.linear.kernels.gdn_triton")


def test_chunk_kernel_matches_recurrence(gdn_triton: Any) -> None:
    """SGLang's chunked kernel (its extend path) in float32 on a varlen batch: sequences across
    64-token chunk boundaries, of one token, of exactly one chunk; initial states read from and
    final states written to scattered pool slots (a zero one, as for a fresh request)."""
    gen = torch.Generator().manual_seed(0)
    lens, slots = [130, 1, 64, 70], [5, 0, 3, 2]
    total, scale = sum(lens), K**-0.5
    q, k = torch.randn(1, total, H, K, generator=gen), torch.randn(1, total, H, K, generator=gen)
    v = torch.randn(1, total, HV, V, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, total, HV, generator=gen))
    beta = torch.rand(1, total, HV, generator=gen)
    pool = torch.randn(7, HV, V, K, generator=gen) * 0.5
    pool[0] = 0.0
    before = pool.clone()
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    indices = torch.tensor(slots, dtype=torch.int32)
    o, _, _ = gdn_triton.chunk_gated_delta_rule(
        q=q, k=k, v=v, g=g, beta=beta, initial_state=pool, initial_state_indices=indices,
        cu_seqlens=cu, head_first=False, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    assert o.dtype == torch.float32 and o.shape == v.shape
    for n, slot in enumerate(slots):
        a, b = int(cu[n]), int(cu[n + 1])
        ref_o, ref_s = _recurrence(q[0, a:b], k[0, a:b], v[0, a:b], g[0, a:b], beta[0, a:b],
                                   before[slot], scale)  # fmt: skip
        torch.testing.assert_close(o[0, a:b].double(), ref_o, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(pool[slot].double(), ref_s, atol=2e-5, rtol=1e-4)
    untouched = [s for s in range(pool.shape[0]) if s not in slots]
    assert torch.equal(pool[untouched], before[untouched])


def test_float32_patched_bfloat16_refused(gdn_triton: Any) -> None:
    """Stock SGLang's function asserts bfloat16 (why the patch exists). The patched name wraps
    it: float32 takes the path above, bfloat16 (which the interpreter computes on raw bits) is
    refused with the reason."""
    from sglang.kernels.ops.attention.fla import chunk

    x = torch.zeros(1, 4, H, K)
    with pytest.raises(AssertionError, match="float32"):
        chunk.chunk_gated_delta_rule(x, x, x, x[..., 0], x[..., 0])
    assert gdn_triton.chunk_gated_delta_rule.__wrapped__ is chunk.chunk_gated_delta_rule
    y = x.bfloat16()
    with pytest.raises(RuntimeError, match="--dtype float32"):
        gdn_triton.chunk_gated_delta_rule(y, y, y, x[..., 0], x[..., 0])


def test_packed_decode_matches_recurrence(gdn_triton: Any) -> None:
    """SGLang's decode kernel (packed q/k/v, gates from a/b in the kernel): one step for three
    requests from their pool slots; a padded row (slot -1) outputs zeros and writes nothing."""
    from sglang.kernels.ops.attention.fla.fused_recurrent import (
        fused_recurrent_gated_delta_rule_packed_decode,
    )

    gen = torch.Generator().manual_seed(1)
    slots = [4, -1, 1]
    batch, scale = len(slots), K**-0.5
    mixed = torch.randn(batch, 2 * H * K + HV * V, generator=gen)
    a, b = torch.randn(batch, HV, generator=gen), torch.randn(batch, HV, generator=gen)
    a_log, dt_bias = torch.randn(HV, generator=gen) * 0.5, torch.randn(HV, generator=gen)
    pool = torch.randn(6, HV, V, K, generator=gen) * 0.5
    before = pool.clone()
    out = torch.empty(batch, 1, HV, V)
    fused_recurrent_gated_delta_rule_packed_decode(
        mixed_qkv=mixed, a=a, b=b, A_log=a_log, dt_bias=dt_bias, scale=scale,
        initial_state=pool, out=out, ssm_state_indices=torch.tensor(slots, dtype=torch.int32),
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    for n, slot in enumerate(slots):
        if slot < 0:
            assert torch.equal(out[n], torch.zeros_like(out[n]))
            continue
        q, k, v = mixed[n].split([H * K, H * K, HV * V])
        g = -a_log.double().exp() * torch.nn.functional.softplus(a[n].double() + dt_bias)
        ref_o, ref_s = _recurrence(
            q.view(1, H, K), k.view(1, H, K), v.view(1, HV, V), g[None],
            torch.sigmoid(b[n])[None], before[slot], scale,
        )  # fmt: skip
        torch.testing.assert_close(out[n, 0].double(), ref_o[0], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(pool[slot].double(), ref_s, atol=2e-5, rtol=1e-4)
    untouched = [s for s in range(pool.shape[0]) if s not in slots]
    assert torch.equal(pool[untouched], before[untouched])


def test_install_is_idempotent(gdn_triton: Any) -> None:
    from sglang.kernels.ops.attention.fla import chunk_o, op

    from jenga_sglang import _fla_cpu_math

    assert op.exp is _fla_cpu_math.exp and chunk_o.safe_exp.fn.__globals__["exp"] is op.exp
    assert cpu_gdn.install() == []


# --- the served model against transformers ----------------------------------------------------


def _generate(url: str, ids: list[int], new_tokens: int) -> dict[str, Any]:
    body = {
        "input_ids": ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens},
        "return_logprob": True,
        "top_logprobs_num": 5,
    }
    request = urllib.request.Request(
        url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as reply:
        return dict(json.loads(reply.read()))


# transformers' forward runs in its own process: in this one tests/triton_cpu.py stands in for
# causal_conv1d's CUDA extension, so transformers would pick that library's kernels over its
# torch fallbacks and hit the stand-in.
_REFERENCE = """
import json, sys
import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
out = []
for ids, start in json.loads(sys.stdin.read()):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, start:]
    out.append(torch.log_softmax(logits.double(), -1).tolist())
print(json.dumps(out))
"""


def _reference_logprobs(model_dir: Path, sequences: list[tuple[list[int], int]]) -> list[Any]:
    """transformers' log-probabilities of the next token after each prefix of each sequence,
    from position `start` on: one tensor [len - start, vocab] per (ids, start)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", _REFERENCE, str(model_dir)], input=json.dumps(sequences),
        capture_output=True, text=True, env=env, timeout=300, check=True,
    )  # fmt: skip
    return [torch.tensor(x, dtype=torch.float64) for x in json.loads(done.stdout)]


# SGLang keeps conv states in bfloat16 by default; a decode step then reads a rounded conv window
# (log-probabilities off by ~1e-2 from the float32 model). The model's own float32 here.
_FLOAT32_CONV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the plugin's CPU mode is off with CUDA")
def test_stock_server_matches_transformers(tmp_path: Path) -> None:
    """Greedy tokens and their log-probabilities (and each step's top 5) of a 200-token prompt
    and of its next turn (which resumes from the GDN and conv states SGLang cached at the end of
    the first) equal transformers' float32 forward of the same checkpoint."""
    model_dir = tmp_path / "tiny-qwen3_5"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    script = ROOT / "scripts" / "make_tiny_model.py"
    command = [sys.executable, str(script), "--family", "qwen3_5", "--out", str(model_dir)]
    subprocess.run(command, check=True, env=env, timeout=300, capture_output=True)
    family = FAMILIES["qwen3_5"]
    gen = torch.Generator().manual_seed(3)
    first = torch.randint(6, 512, (200,), generator=gen).tolist()
    tail = torch.randint(6, 512, (40,), generator=gen).tolist()
    new_tokens = 8

    with LocalServer(
        str(model_dir), list(family.serve_flags), log=tmp_path / "server.log",
        ready_timeout_s=420.0, env={**dict(family.serve_env), **_FLOAT32_CONV},
    ) as server:  # fmt: skip
        turn1 = _generate(server.url, first, new_tokens)
        second = first + list(turn1["output_ids"]) + tail
        turn2 = _generate(server.url, second, new_tokens)
    assert turn2["meta_info"]["cached_tokens"] >= len(first)  # the state path was taken

    served = (turn1, turn2)
    worst = 0.0
    sequences = [
        (p + list(r["output_ids"]), len(p) - 1)
        for p, r in zip((first, second), served, strict=True)
    ]
    for logprobs, answer in zip(_reference_logprobs(model_dir, sequences), served, strict=True):
        tokens = list(answer["output_ids"])
        assert len(tokens) == new_tokens
        # Teacher-forced on the served tokens: each is transformers' argmax, so the served
        # sequence is transformers' greedy one.
        assert logprobs[:new_tokens].argmax(-1).tolist() == tokens
        meta = answer["meta_info"]
        for step, (token, top) in enumerate(
            zip(meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True)
        ):
            assert abs(token[0] - float(logprobs[step, token[1]])) < 1e-4, (step, token)
            ref_top = logprobs[step].topk(5)
            assert [t[1] for t in top] == ref_top.indices.tolist()
            diffs = [abs(t[0] - float(r)) for t, r in zip(top, ref_top.values, strict=True)]
            assert max(diffs) < 1e-4, (step, diffs)
            worst = max(worst, *diffs)
    print(f"tokens {turn1['output_ids']} / {turn2['output_ids']}; largest top-5 logprob diff "
          f"vs transformers {worst:.2e}")  # fmt: skip
